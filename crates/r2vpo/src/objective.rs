//! Policy objectives: the R²VPO ratio-variance penalty and the baselines the
//! paper compares against, all behind one flat [`ObjectiveConfig`].
//!
//! Notation: per token, `x = clamp(log π_θ − log π_off, ±c)` and `r = e^x`
//! (the paper's ρ_t(θ)); `A` is the advantage; `sg` is stop-gradient. Every
//! function returns a **loss to minimise**, i.e. the negated objective.
//!
//! | kind | per-token loss ℓ | paper / anchor |
//! |---|---|---|
//! | [`ObjectiveKind::R2vpo`] | `−r·A + λ(r−1)²` | Eq. (primal_dual), gradient Eq. (gradient) |
//! | [`ObjectiveKind::Clip`] | `max(−rA, −clip(r,1−ε_l,1+ε_h)A)`, then dual-clip `min(·, −cA)` for `A<0` | Eq. (clip_obj); verl `compute_policy_loss_vanilla` |
//! | [`ObjectiveKind::Gppo`] | clipped value ×β but with gradient `−β(1±ε)A∇logπ` | KlearReasoner `gppo_general` |
//! | [`ObjectiveKind::Topr`] | `−A·logπ` (A>0), `−sg(clip(ρ,0,1))·A·logπ` (A≤0) | TOPR eq. 8; ROLL / Trinity-RFT |
//! | [`ObjectiveKind::KlPenalty`] | `−r·A + λ·k(x)`, `k` an estimator of KL(π_off‖π_θ) | the paper's "GRPO-KL" (exact-KL comparison) |
//! | [`ObjectiveKind::IsPg`] | `−r·A` | the unclipped objective J^UNC of Theorem 3.3 |
//!
//! Conventions shared by every kind:
//! - `old_logp` and `advantages` are detached: only `logp` carries gradient.
//! - Masked tokens are replaced by neutral values (log-ratio 0, advantage 0,
//!   log-prob 0) *before* any arithmetic, so padding that holds garbage (even
//!   NaN or ±∞) can change neither the loss, nor its gradient, nor the
//!   statistics; `per_token` is exactly 0 there.
//! - The log-ratio is clamped to `±log_ratio_clamp` before `exp` (verl clamps at
//!   ±20). Outside the clamp a token gets no gradient, like `torch.clamp`.
//! - [`RatioStats`] are computed on detached values of the micro-batch at hand,
//!   over its unmasked tokens; [`RatioStats::merge`] pools micro-batches.

use std::fmt;

use candle_core::{DType, Tensor, D};
use serde::{Deserialize, Serialize};

use crate::aggregate::{aggregate, Aggregation, GlobalBatch};
use crate::{Error, Result};

/// Probability levels reported in [`RatioStats::quantiles`].
pub const QUANTILES: [f64; 7] = [0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99];

/// Bound applied to the k3 estimator's value, as verl's `kl_penalty_forward`
/// does: a single token with ρ ≈ e^{2.4} (or ρ ≈ e^{−11}) would otherwise
/// outweigh the whole batch. Tokens beyond it get no penalty gradient.
pub const K3_CLAMP: f64 = 10.0;

/// Largest accepted [`ObjectiveConfig::log_ratio_clamp`]: `exp(88.7)`
/// overflows `f32`, and the objective must work for F32 tensors.
pub const MAX_LOG_RATIO_CLAMP: f64 = 80.0;

/// The inputs of one micro-batch, all `(B, T)` (control uses `T = 1`).
#[derive(Clone, Copy, Debug)]
pub struct PolicyBatch<'a> {
    /// Current per-token log-probabilities log π_θ; the only differentiable input.
    pub logp: &'a Tensor,
    /// Behaviour log-probabilities log π_off (the policy that generated the
    /// data, possibly several iterations stale); detached.
    pub old_logp: &'a Tensor,
    /// Per-token advantages Â; detached.
    pub advantages: &'a Tensor,
    /// 1 for tokens that count, 0 for padding.
    pub mask: &'a Tensor,
    /// Detached per-token weights on the policy-gradient term (the
    /// rollout–trainer mismatch correction, [`crate::correction`]); `None`
    /// is all ones.
    pub weights: Option<&'a Tensor>,
}

/// Which policy objective to optimise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObjectiveKind {
    /// R²VPO: importance-weighted advantage minus λ(ρ−1)² (Eq. primal_dual).
    R2vpo,
    /// PPO/GRPO clipping with optional dual-clip and asymmetric (clip-higher) bounds.
    Clip,
    /// GPPO: clipping whose clipped tokens keep a bounded gradient.
    Gppo,
    /// TOPR: tapered off-policy REINFORCE.
    Topr,
    /// Importance-weighted advantage minus λ·KL estimate (the paper's GRPO-KL).
    KlPenalty,
    /// Plain importance-sampled policy gradient, no regulariser.
    IsPg,
    /// M2PO: the unclipped `ρÂ` on the tokens left after masking the
    /// largest `(log ρ)²` until their mean is ≤ τ_M2.
    M2po,
    /// `ρÂ − λ(log ρ)²`: R²VPO's penalty in log-ratio form (prime-rl's
    /// `kl_tau` term), fixed λ or the dual λ.
    LogRatioSq,
    /// SPO: `ρÂ − |Â|/(2ε)·(ρ−1)²`, a penalty scaled by each token's |Â|.
    Spo,
    /// GSPO: clipping of a sequence-level ratio (geometric mean of ρ).
    Gspo,
    /// CISPO: REINFORCE weighted by the clipped, detached ratio.
    Cispo,
    /// SAPO: a sigmoid gate of the ratio instead of a hard clip.
    Sapo,
    /// DPPO with a total-variation trust region on the sampled token's probability.
    DppoTv,
    /// DPPO with a binary-KL trust region on the sampled token's probability.
    DppoKl,
}

impl ObjectiveKind {
    /// The config name (the serde name: `r2vpo`, `clip`, `kl-penalty`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectiveKind::R2vpo => "r2vpo",
            ObjectiveKind::Clip => "clip",
            ObjectiveKind::Gppo => "gppo",
            ObjectiveKind::Topr => "topr",
            ObjectiveKind::KlPenalty => "kl-penalty",
            ObjectiveKind::IsPg => "is-pg",
            ObjectiveKind::M2po => "m2po",
            ObjectiveKind::LogRatioSq => "log-ratio-sq",
            ObjectiveKind::Spo => "spo",
            ObjectiveKind::Gspo => "gspo",
            ObjectiveKind::Cispo => "cispo",
            ObjectiveKind::Sapo => "sapo",
            ObjectiveKind::DppoTv => "dppo-tv",
            ObjectiveKind::DppoKl => "dppo-kl",
        }
    }

    /// Whether the objective has a penalty coefficient λ (R²VPO's dual
    /// variable, or the KL coefficient): only then does λ act on the loss,
    /// move by the dual update (Eq. λ update) and need to be finite and ≥ 0.
    pub fn uses_lambda(self) -> bool {
        matches!(self, ObjectiveKind::R2vpo | ObjectiveKind::KlPenalty | ObjectiveKind::LogRatioSq)
    }
}

/// Per-sample estimator of KL(π_off‖π_θ) from a sample drawn from π_off
/// (Schulman's k1/k2/k3, with `x = log ρ = log π_θ − log π_off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlEstimator {
    /// `k1 = −x`: unbiased, high variance, can be negative per token.
    K1,
    /// `k2 = ½x²`: biased (exact only to second order), low variance, ≥ 0.
    K2,
    /// `k3 = eˣ − 1 − x`: unbiased, low variance, ≥ 0; clamped to [`K3_CLAMP`].
    K3,
}

impl KlEstimator {
    /// The config name (`k1`, `k2`, `k3`).
    pub fn as_str(self) -> &'static str {
        match self {
            KlEstimator::K1 => "k1",
            KlEstimator::K2 => "k2",
            KlEstimator::K3 => "k3",
        }
    }
}

/// Where TOPR's taper `sg(clamp(ρ, 0, 1))` takes its ratio from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RatioLevel {
    /// ρ per token (ROLL and Trinity-RFT).
    Token,
    /// One ρ per sequence, `exp(Σ_t m_t·log r_t)`, broadcast to its tokens
    /// (the TOPR paper's trajectory ratio π(τ)/μ(τ)).
    Sequence,
}

impl RatioLevel {
    /// The config name (`token`, `sequence`).
    pub fn as_str(self) -> &'static str {
        match self {
            RatioLevel::Token => "token",
            RatioLevel::Sequence => "sequence",
        }
    }
}

/// The `[objective]` table of a run configuration. One flat struct for every
/// kind, so switching kind is one line of TOML; fields a kind does not use
/// are ignored by it. Defaults are R²VPO with the paper's values.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectiveConfig {
    /// Which objective. Default [`ObjectiveKind::R2vpo`].
    pub kind: ObjectiveKind,
    /// Lower clip width ε_l (clip and GPPO). Every kind also uses it to report
    /// [`RatioStats::clip_frac_low`], so runs stay comparable. Default 0.2.
    pub eps_low: f64,
    /// Upper clip width ε_h (0.28 for DAPO's clip-higher). Also used for
    /// [`RatioStats::clip_frac_high`] by every kind. Default 0.2.
    pub eps_high: f64,
    /// Dual-clip constant c > 1 for tokens with A < 0 (clip and GPPO); `None`
    /// disables it. Default `Some(3.0)` (verl's `clip_ratio_c`). In TOML,
    /// disable it with `dual_clip = "none"` (or `false`), because TOML has no
    /// null and an omitted key means the default.
    #[serde(with = "dual_clip_serde")]
    pub dual_clip: Option<f64>,
    /// GPPO's β₁, scaling the kept gradient of clipped tokens with A < 0.
    /// Default 0.25: KlearReasoner's `ppo_trainer.yaml` and its released
    /// GPPO script both use 0.25 / 1.0; its README's "β₁ = β₂ = 1" contradicts
    /// the code that produced its numbers, so the code wins.
    pub gppo_beta1: f64,
    /// GPPO's β₂, scaling the kept gradient of clipped tokens with A > 0. Default 1.0.
    pub gppo_beta2: f64,
    /// TOPR's ratio level. Default [`RatioLevel::Token`]: both public
    /// implementations (ROLL, Trinity-RFT), which are what GRPO-family
    /// baselines are run with, use it; and a sequence ratio over thousands
    /// of tokens is a product of thousands of factors, so its taper collapses
    /// to ≈0 (negatives silently dropped) or 1 (no taper). Both coincide at T = 1.
    pub topr_ratio_level: RatioLevel,
    /// TOPR weight of positive-advantage tokens (ROLL's `topr_positive_weight`). Default 1.0.
    pub topr_positive_weight: f64,
    /// TOPR weight of non-positive-advantage tokens. Default 1.0.
    pub topr_negative_weight: f64,
    /// KL estimator of [`ObjectiveKind::KlPenalty`] (and of `constraint`
    /// for that kind). Default k3, the value is clamped to [`K3_CLAMP`].
    pub kl_estimator: KlEstimator,
    /// |log ρ| is clamped to this before `exp`, in (0, [`MAX_LOG_RATIO_CLAMP`]].
    /// Default 20 (verl). The clamped fraction is reported.
    pub log_ratio_clamp: f64,
    /// How per-token losses become the scalar loss. Default token-mean.
    pub aggregation: Aggregation,
    /// M2PO's bound τ_M2 on the mean `(log ρ)²` of the kept tokens. Default
    /// 0.04, the value of every experiment in the M2PO paper.
    pub m2po_tau: f64,
    /// SPO's ε: a token's optimum ratio is `1 ± ε`. Default 0.2 (the SPO
    /// code's `--epsilon`).
    pub spo_eps: f64,
    /// CISPO's cap on the detached importance weight. Default 5.0 (TRL's
    /// documented CISPO setting `epsilon_high = 5.0`).
    pub cispo_cap: f64,
    /// SAPO's gate temperature for A > 0. Default 1.0 (TRL).
    pub sapo_tau_pos: f64,
    /// SAPO's gate temperature for A ≤ 0. Default 1.05 (TRL).
    pub sapo_tau_neg: f64,
    /// Rollout–trainer mismatch correction: detached weights from the
    /// learner's old log-probs over the engine's, on the policy-gradient term
    /// ([`crate::correction`]). Default none.
    pub rollout_correction: crate::correction::RolloutCorrection,
    /// The correction's cap C: TIS truncates the weight at C, MIS zeroes the
    /// tokens (or sequences) whose weight exceeds it. Default 2.0 (verl).
    pub rollout_correction_cap: f64,
}

impl Default for ObjectiveConfig {
    fn default() -> Self {
        ObjectiveConfig {
            kind: ObjectiveKind::R2vpo,
            eps_low: 0.2,
            eps_high: 0.2,
            dual_clip: Some(3.0),
            gppo_beta1: 0.25,
            gppo_beta2: 1.0,
            topr_ratio_level: RatioLevel::Token,
            topr_positive_weight: 1.0,
            topr_negative_weight: 1.0,
            kl_estimator: KlEstimator::K3,
            log_ratio_clamp: 20.0,
            aggregation: Aggregation::TokenMean,
            m2po_tau: 0.04,
            spo_eps: 0.2,
            cispo_cap: 5.0,
            sapo_tau_pos: 1.0,
            sapo_tau_neg: 1.05,
            rollout_correction: crate::correction::RolloutCorrection::None,
            rollout_correction_cap: 2.0,
        }
    }
}

/// The result of [`ObjectiveConfig::loss`].
#[derive(Clone, Debug)]
pub struct ObjectiveOutput {
    /// The 0-dim loss to minimise; carries the autograd graph of `logp`.
    pub loss: Tensor,
    /// `(B, T)` per-token losses before aggregation (0 at masked tokens).
    pub per_token: Tensor,
    /// Detached diagnostics.
    pub stats: RatioStats,
}

/// Detached ratio diagnostics over the unmasked tokens of one micro-batch.
///
/// Every field but `pg_loss` and `penalty` is a plain mean over tokens, so
/// micro-batches pool by token weights ([`RatioStats::merge`]); `pg_loss` and
/// `penalty` are aggregated with the global normalisers, so they pool by sum.
/// A batch without unmasked tokens gives all zeros and no quantiles.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RatioStats {
    /// Number of unmasked tokens.
    pub tokens: f64,
    /// Mean of ρ (≈ 1 when the data are on-policy).
    pub ratio_mean: f64,
    /// Population variance of ρ (divides by the token count).
    pub ratio_var: f64,
    /// E\[(ρ−1)²\], the second moment the paper constrains (Eq. var_problem).
    pub sq_dev_mean: f64,
    /// Smallest ρ.
    pub ratio_min: f64,
    /// Largest ρ.
    pub ratio_max: f64,
    /// `(q, value)` for each q of [`QUANTILES`], linear interpolation between
    /// order statistics (numpy's default).
    pub quantiles: Vec<(f64, f64)>,
    /// Fraction with ρ < 1 − ε_l, whatever the advantage sign (tokens outside
    /// the trust region; verl's `pg_clipfrac` counts only the side the sign
    /// makes active).
    pub clip_frac_low: f64,
    /// Fraction with ρ > 1 + ε_h, whatever the advantage sign.
    pub clip_frac_high: f64,
    /// Fraction where the dual-clip would bind: A < 0 and ρ > c (0 when disabled).
    pub clip_frac_dual: f64,
    /// mean(log π_off − log π_θ), the k1 estimate of KL(π_off‖π_θ) (verl's `ppo_kl`).
    pub approx_kl: f64,
    /// Mean k3 estimate of KL(π_off‖π_θ), with the same clamp the penalty uses.
    pub kl_k3: f64,
    /// Fraction of tokens whose |log ρ| exceeded `log_ratio_clamp`.
    pub log_ratio_clamped_frac: f64,
    /// Fraction of tokens the objective's own mask dropped (M2PO's second
    /// moment, DPPO's trust region); 0 for the other kinds.
    #[serde(default)]
    pub masked_frac: f64,
    /// Aggregated policy-gradient part of the loss (detached).
    pub pg_loss: f64,
    /// Aggregated penalty part of the loss (detached; 0 for kinds without one).
    pub penalty: f64,
    /// The statistic the dual update consumes: E\[(ρ−1)²\] for every kind but
    /// [`ObjectiveKind::KlPenalty`], whose constraint is E\[k\] of its
    /// estimator, and [`ObjectiveKind::LogRatioSq`], whose is E\[(log ρ)²\].
    pub constraint: f64,
}

impl RatioStats {
    /// Pools the statistics of the micro-batches of one optimiser step.
    ///
    /// Means, variance, min/max and fractions are exact; `pg_loss` and
    /// `penalty` are summed, which is exact because each micro-batch loss is
    /// normalised by global totals. Quantiles cannot be pooled from summaries:
    /// they are token-weighted averages of the parts' quantiles, an
    /// approximation.
    pub fn merge(parts: &[RatioStats]) -> RatioStats {
        if let [one] = parts {
            // Pooling one part is the identity; say so exactly rather than
            // through (n·x)/n, which can round.
            return if one.tokens > 0.0 {
                one.clone()
            } else {
                RatioStats { pg_loss: one.pg_loss, penalty: one.penalty, ..RatioStats::default() }
            };
        }
        let live: Vec<&RatioStats> = parts.iter().filter(|p| p.tokens > 0.0).collect();
        let tokens: f64 = live.iter().map(|p| p.tokens).sum();
        let mut out = RatioStats {
            pg_loss: parts.iter().map(|p| p.pg_loss).sum(),
            penalty: parts.iter().map(|p| p.penalty).sum(),
            ..RatioStats::default()
        };
        if tokens == 0.0 {
            return out;
        }
        let wmean = |f: &dyn Fn(&RatioStats) -> f64| live.iter().map(|p| p.tokens * f(p)).sum::<f64>() / tokens;
        out.tokens = tokens;
        out.ratio_mean = wmean(&|p| p.ratio_mean);
        // Pool second moments, not variances: E[ρ²] = Var + mean².
        let second = wmean(&|p| p.ratio_var + p.ratio_mean * p.ratio_mean);
        out.ratio_var = (second - out.ratio_mean * out.ratio_mean).max(0.0);
        out.sq_dev_mean = wmean(&|p| p.sq_dev_mean);
        out.ratio_min = live.iter().map(|p| p.ratio_min).fold(f64::INFINITY, f64::min);
        out.ratio_max = live.iter().map(|p| p.ratio_max).fold(f64::NEG_INFINITY, f64::max);
        out.quantiles = QUANTILES
            .iter()
            .enumerate()
            .map(|(i, &q)| (q, wmean(&|p| p.quantiles.get(i).map_or(f64::NAN, |v| v.1))))
            .collect();
        out.clip_frac_low = wmean(&|p| p.clip_frac_low);
        out.clip_frac_high = wmean(&|p| p.clip_frac_high);
        out.clip_frac_dual = wmean(&|p| p.clip_frac_dual);
        out.approx_kl = wmean(&|p| p.approx_kl);
        out.kl_k3 = wmean(&|p| p.kl_k3);
        out.log_ratio_clamped_frac = wmean(&|p| p.log_ratio_clamped_frac);
        out.masked_frac = wmean(&|p| p.masked_frac);
        out.constraint = wmean(&|p| p.constraint);
        out
    }
}

fn invalid(field: &str, message: impl Into<String>) -> Error {
    Error::InvalidConfig { field: field.to_string(), message: message.into() }
}

impl ObjectiveConfig {
    /// Checks every field's range; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        let check = |ok: bool, field: &str, msg: &str, v: f64| {
            if ok {
                Ok(())
            } else {
                Err(invalid(field, format!("{msg}, got {v}")))
            }
        };
        check(self.eps_low > 0.0 && self.eps_low < 1.0, "objective.eps_low", "must be in (0, 1)", self.eps_low)?;
        // ε_high ≥ 1 would let ρ double before clipping: no trust region is
        // left (DAPO's clip-higher is 0.28; the paper's widest is 0.3).
        check(self.eps_high > 0.0 && self.eps_high < 1.0, "objective.eps_high", "must be in (0, 1)", self.eps_high)?;
        if let Some(c) = self.dual_clip {
            check(c > 1.0 && c.is_finite(), "objective.dual_clip", "must be finite and > 1 (or \"none\")", c)?;
        }
        for (v, field) in [
            (self.m2po_tau, "objective.m2po_tau"),
            (self.spo_eps, "objective.spo_eps"),
            (self.sapo_tau_pos, "objective.sapo_tau_pos"),
            (self.sapo_tau_neg, "objective.sapo_tau_neg"),
        ] {
            check(v > 0.0 && v.is_finite(), field, "must be finite and > 0", v)?;
        }
        for (v, field) in
            [(self.cispo_cap, "objective.cispo_cap"), (self.rollout_correction_cap, "objective.rollout_correction_cap")]
        {
            check(v >= 1.0 && v.is_finite(), field, "must be finite and >= 1", v)?;
        }
        for (v, field) in [
            (self.gppo_beta1, "objective.gppo_beta1"),
            (self.gppo_beta2, "objective.gppo_beta2"),
            (self.topr_positive_weight, "objective.topr_positive_weight"),
            (self.topr_negative_weight, "objective.topr_negative_weight"),
        ] {
            check(v >= 0.0 && v.is_finite(), field, "must be finite and >= 0", v)?;
        }
        check(
            self.log_ratio_clamp > 0.0 && self.log_ratio_clamp <= MAX_LOG_RATIO_CLAMP,
            "objective.log_ratio_clamp",
            "must be in (0, 80] (exp overflows f32 beyond ~88)",
            self.log_ratio_clamp,
        )
    }

    /// The loss of one micro-batch, normalised by the global batch totals.
    ///
    /// `lambda` is the penalty coefficient: R²VPO's dual variable λ, or the KL
    /// coefficient for [`ObjectiveKind::KlPenalty`]; other kinds ignore it.
    /// Where used it must be finite and ≥ 0 (λ is a Lagrange multiplier of an
    /// inequality constraint).
    pub fn loss(&self, batch: &PolicyBatch, lambda: f64, global: &GlobalBatch) -> Result<ObjectiveOutput> {
        self.validate()?;
        if self.kind.uses_lambda() && !(lambda.is_finite() && lambda >= 0.0) {
            return Err(invalid("lambda", format!("the penalty coefficient must be finite and >= 0, got {lambda}")));
        }
        let p = Prepared::new(batch, self.log_ratio_clamp)?;
        // A kind that masks tokens of its own (M2PO, DPPO) leaves its 0/1
        // keep-mask here, for the masked fraction it reports.
        let mut keep: Option<Tensor> = None;
        let (mut pg, penalty) = match self.kind {
            ObjectiveKind::R2vpo => {
                (is_pg_per_token(&p.ratio, &p.adv)?, Some(r2vpo_penalty_per_token(&p.ratio, lambda)?))
            }
            ObjectiveKind::Clip => {
                (clip_per_token(&p.ratio, &p.adv, self.eps_low, self.eps_high, self.dual_clip)?, None)
            }
            ObjectiveKind::Gppo => (
                gppo_per_token(
                    &p.ratio,
                    &p.adv,
                    self.eps_low,
                    self.eps_high,
                    self.gppo_beta1,
                    self.gppo_beta2,
                    self.dual_clip,
                )?,
                None,
            ),
            ObjectiveKind::Topr => {
                let taper = match self.topr_ratio_level {
                    RatioLevel::Token => p.ratio.clone(),
                    RatioLevel::Sequence => sequence_ratio(&p.log_ratio, &p.mask, self.log_ratio_clamp)?,
                };
                (topr_per_token(&p.logp, &taper, &p.adv, self.topr_positive_weight, self.topr_negative_weight)?, None)
            }
            ObjectiveKind::KlPenalty => (
                is_pg_per_token(&p.ratio, &p.adv)?,
                Some(kl_estimate(self.kl_estimator, &p.log_ratio)?.affine(lambda, 0.0)?),
            ),
            ObjectiveKind::IsPg => (is_pg_per_token(&p.ratio, &p.adv)?, None),
            ObjectiveKind::M2po => {
                let k = m2po_keep_mask(&p.log_ratio, &p.mask, self.m2po_tau)?;
                let l = m2po_per_token(&p.ratio, &p.adv, &k)?;
                keep = Some(k);
                (l, None)
            }
            ObjectiveKind::LogRatioSq => {
                (is_pg_per_token(&p.ratio, &p.adv)?, Some(log_ratio_sq_penalty(&p.log_ratio, lambda)?))
            }
            ObjectiveKind::Spo => {
                (is_pg_per_token(&p.ratio, &p.adv)?, Some(spo_penalty(&p.ratio, &p.adv, self.spo_eps)?))
            }
            ObjectiveKind::Gspo => {
                let s = gspo_sequence_ratio(&p.log_ratio, &p.logp, &p.mask, self.log_ratio_clamp)?;
                (clip_per_token(&s, &p.adv, self.eps_low, self.eps_high, None)?, None)
            }
            ObjectiveKind::Cispo => (cispo_per_token(&p.logp, &p.ratio, &p.adv, self.cispo_cap)?, None),
            ObjectiveKind::Sapo => (sapo_per_token(&p.ratio, &p.adv, self.sapo_tau_pos, self.sapo_tau_neg)?, None),
            ObjectiveKind::DppoTv | ObjectiveKind::DppoKl => {
                let k = dppo_keep_mask(&p.logp, &p.old, &p.adv, &p.mask, self.kind, self.eps_low, self.eps_high)?;
                let l = dppo_per_token(&p.logp, &p.ratio, &p.adv, &k, self.dual_clip)?;
                keep = Some(k);
                (l, None)
            }
        };
        // Rollout–trainer mismatch weights act on the policy-gradient term
        // only, detached (verl's rollout correction, TRL's vLLM IS).
        if let Some(w) = &p.weights {
            pg = pg.mul(w)?;
        }
        let per_token = match &penalty {
            Some(pen) => pg.add(pen)?,
            None => pg.clone(),
        };
        let loss = aggregate(&per_token, &p.mask, self.aggregation, global)?;
        let detached_agg = |t: &Tensor| -> Result<f64> {
            Ok(aggregate(&t.detach(), &p.mask, self.aggregation, global)?.to_dtype(DType::F64)?.to_scalar::<f64>()?)
        };
        let mut stats = ratio_stats(batch, self)?;
        if let (Some(k), true) = (&keep, stats.tokens > 0.0) {
            let kept = k.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
            stats.masked_frac = 1.0 - kept / stats.tokens;
        }
        stats.pg_loss = detached_agg(&pg)?;
        stats.penalty = match &penalty {
            Some(pen) => detached_agg(pen)?,
            None => 0.0,
        };
        Ok(ObjectiveOutput { loss, per_token, stats })
    }
}

/// Inputs in one dtype, with masked tokens neutralised.
struct Prepared {
    mask: Tensor,
    /// Clamped log-ratio, 0 at masked tokens; differentiable through `logp`.
    log_ratio: Tensor,
    ratio: Tensor,
    /// Detached advantages, 0 at masked tokens.
    adv: Tensor,
    /// log π_θ, 0 at masked tokens (TOPR differentiates it directly).
    logp: Tensor,
    /// Detached log π_off, 0 at masked tokens.
    old: Tensor,
    /// Detached rollout-correction weights, 0 at masked tokens.
    weights: Option<Tensor>,
}

impl Prepared {
    fn new(batch: &PolicyBatch, clamp: f64) -> Result<Self> {
        check_shapes(batch)?;
        let dtype = batch.logp.dtype();
        let mask = batch.mask.detach().to_dtype(dtype)?;
        let valid = mask.gt(0.0)?;
        let zeros = batch.logp.zeros_like()?;
        // `where_cond`, not multiplication by the mask: 0·NaN is NaN, and padded
        // positions of real batches do hold NaN/∞ log-probs.
        let logp = valid.where_cond(batch.logp, &zeros)?;
        let old = valid.where_cond(&batch.old_logp.detach().to_dtype(dtype)?, &zeros)?;
        let adv = valid.where_cond(&batch.advantages.detach().to_dtype(dtype)?, &zeros)?;
        let log_ratio = clamped_log_ratio(&logp, &old, clamp)?;
        let ratio = log_ratio.exp()?;
        let weights = match batch.weights {
            Some(w) => Some(valid.where_cond(&w.detach().to_dtype(dtype)?, &zeros)?),
            None => None,
        };
        Ok(Prepared { mask, log_ratio, ratio, adv, logp, old, weights })
    }
}

fn check_shapes(batch: &PolicyBatch) -> Result<()> {
    let dims = batch.logp.dims();
    let same = [batch.old_logp, batch.advantages, batch.mask].iter().all(|t| t.dims() == dims)
        && batch.weights.is_none_or(|w| w.dims() == dims);
    if dims.len() != 2 || !same {
        return Err(Error::Shape(format!(
            "objective: logp {:?}, old_logp {:?}, advantages {:?} and mask {:?} must all be the same (B, T)",
            dims,
            batch.old_logp.dims(),
            batch.advantages.dims(),
            batch.mask.dims()
        )));
    }
    Ok(())
}

/// Clamp with `torch.clamp`'s gradient: 1 on the closed interval, 0 outside.
/// candle's `clamp` is built from `maximum`/`minimum`, which halve the
/// gradient at a tie, so a value sitting exactly on a bound would otherwise
/// get half a gradient.
fn clamp_st(x: &Tensor, lo: f64, hi: f64) -> Result<Tensor> {
    let c = x.clamp(lo, hi)?;
    let inside = c.eq(x)?;
    Ok(inside.where_cond(x, &c.detach())?)
}

/// `clamp(logp − sg(old_logp), ±c)`, the log of the ratio ρ used by every
/// objective. Gradient 1 w.r.t. `logp` where |log ρ| ≤ c, 0 beyond (as verl).
pub fn clamped_log_ratio(logp: &Tensor, old_logp: &Tensor, c: f64) -> Result<Tensor> {
    clamp_st(&logp.sub(&old_logp.detach())?, -c, c)
}

/// The plain importance-sampled policy-gradient loss `ℓ = −ρ·A`, the negated
/// unclipped objective J^UNC of Theorem 3.3 (`∇ℓ = −A·ρ·∇log π`).
pub fn is_pg_per_token(ratio: &Tensor, adv: &Tensor) -> Result<Tensor> {
    Ok(ratio.mul(adv)?.neg()?)
}

/// R²VPO's penalty `λ(ρ−1)²`, the variance term of Eq. (primal_dual).
///
/// The Lagrangian's `+λδ` is constant in θ, so it is left out of the loss: it
/// only enters the gradient with respect to λ, i.e. Eq. (lambda_update)
/// (see [`crate::dual`]), which consumes [`RatioStats::constraint`].
pub fn r2vpo_penalty_per_token(ratio: &Tensor, lambda: f64) -> Result<Tensor> {
    Ok(ratio.affine(1.0, -1.0)?.sqr()?.affine(lambda, 0.0)?)
}

/// R²VPO per-token loss `ℓ = −ρ·A + λ(ρ−1)²`, the negated Lagrangian of
/// Eq. (primal_dual) without its constant `λδ`.
///
/// Its gradient is Eq. (gradient) negated:
/// `∇ℓ = −(A − 2λ(ρ−1))·ρ·∇log π` — the "regularised advantage" shrinks the
/// step of a token in proportion to how far its ratio has drifted, instead
/// of zeroing it as clipping does.
pub fn r2vpo_per_token(ratio: &Tensor, adv: &Tensor, lambda: f64) -> Result<Tensor> {
    Ok(is_pg_per_token(ratio, adv)?.add(&r2vpo_penalty_per_token(ratio, lambda)?)?)
}

fn check_dual_clip(dual_clip: Option<f64>) -> Result<()> {
    match dual_clip {
        Some(c) if !(c > 1.0 && c.is_finite()) => {
            Err(invalid("objective.dual_clip", format!("must be finite and > 1, got {c}")))
        }
        _ => Ok(()),
    }
}

/// Dual-clip (Ye et al. 2020, verl's `clip_ratio_c`): for A < 0 the loss is
/// capped at `−A·c`, so a token whose ratio exploded past c while being
/// pushed down stops contributing (zero gradient).
fn apply_dual_clip(loss: &Tensor, adv: &Tensor, dual_clip: Option<f64>) -> Result<Tensor> {
    check_dual_clip(dual_clip)?;
    match dual_clip {
        None => Ok(loss.clone()),
        Some(c) => {
            let cap = adv.detach().affine(-c, 0.0)?;
            let capped = cap.minimum(loss)?;
            Ok(adv.lt(0.0)?.where_cond(&capped, loss)?)
        }
    }
}

/// PPO/GRPO clipped loss, Eq. (clip_obj) with asymmetric bounds and
/// dual-clip, exactly as verl's `compute_policy_loss_vanilla`:
/// `ℓ = max(−A·ρ, −A·clip(ρ, 1−ε_l, 1+ε_h))`, then for A < 0 `min(ℓ, −A·c)`.
///
/// Gradient: `−A·ρ·∇log π` inside the band and on the pessimistic side;
/// zero for A > 0, ρ > 1+ε_h, for A < 0, ρ < 1−ε_l, and for A < 0, ρ > c.
pub fn clip_per_token(
    ratio: &Tensor,
    adv: &Tensor,
    eps_low: f64,
    eps_high: f64,
    dual_clip: Option<f64>,
) -> Result<Tensor> {
    let unclipped = is_pg_per_token(ratio, adv)?;
    let clipped = is_pg_per_token(&clamp_st(ratio, 1.0 - eps_low, 1.0 + eps_high)?, adv)?;
    apply_dual_clip(&unclipped.maximum(&clipped)?, adv, dual_clip)
}

/// GPPO (KlearReasoner `compute_gppo_loss_general_beta`), per token:
///
/// - A < 0 and ρ < 1−ε_l: `ℓ = −β₁(1−ε_l)·(ρ/sg(ρ))·A`
/// - A > 0 and ρ > 1+ε_h: `ℓ = −β₂(1+ε_h)·(ρ/sg(ρ))·A`
/// - otherwise `ℓ = −ρ·A`; then dual-clip for A < 0.
///
/// `ρ/sg(ρ)` is 1 in value and has gradient `∇log π`, so a clipped token's
/// loss equals the clipped PPO value ×β while its gradient is the bounded
/// `−β(1±ε)·A·∇log π` instead of PPO's 0.
pub fn gppo_per_token(
    ratio: &Tensor,
    adv: &Tensor,
    eps_low: f64,
    eps_high: f64,
    beta1: f64,
    beta2: f64,
    dual_clip: Option<f64>,
) -> Result<Tensor> {
    let unit = ratio.div(&ratio.detach())?;
    let unit_adv = unit.mul(adv)?;
    let low = adv.lt(0.0)?.mul(&ratio.lt(1.0 - eps_low)?)?;
    let high = adv.gt(0.0)?.mul(&ratio.gt(1.0 + eps_high)?)?;
    let low_loss = unit_adv.affine(-beta1 * (1.0 - eps_low), 0.0)?;
    let high_loss = unit_adv.affine(-beta2 * (1.0 + eps_high), 0.0)?;
    let l = low.where_cond(&low_loss, &high.where_cond(&high_loss, &is_pg_per_token(ratio, adv)?)?)?;
    apply_dual_clip(&l, adv, dual_clip)
}

/// TOPR's trajectory ratio `exp(clamp(Σ_t m_t·log r_t, ±c))`, broadcast to
/// `(B, T)` and detached (it only enters through `sg(·)`). The sum is clamped
/// again because a sum of per-token clamped values can still overflow `exp`.
pub fn sequence_ratio(log_ratio: &Tensor, mask: &Tensor, c: f64) -> Result<Tensor> {
    let mask = mask.to_dtype(log_ratio.dtype())?;
    let per_seq = log_ratio.detach().mul(&mask)?.sum_keepdim(D::Minus1)?.clamp(-c, c)?;
    Ok(per_seq.broadcast_as(log_ratio.shape())?.exp()?)
}

/// TOPR (Roux et al. 2025, eq. 8 as quoted by ROLL), per token:
///
/// - A > 0: `ℓ = −w₊·A·log π` (SFT-like: no importance weight at all);
/// - A ≤ 0: `ℓ = −w₋·sg(clamp(ρ, 0, 1))·A·log π` (ratio tapered to ≤ 1).
///
/// The loss is in `log π`, not ρ, so its gradient is `−w₊·A·∇log π` or
/// `−w₋·clamp(ρ,0,1)·A·∇log π`. The split point is immaterial at A = 0
/// (both branches give 0); "positive ⇔ A > 0" follows ROLL (score > 0) and
/// Trinity-RFT (negative ⇔ A ≤ 0). `taper_ratio` is the token ratio or
/// [`sequence_ratio`].
pub fn topr_per_token(
    logp: &Tensor,
    taper_ratio: &Tensor,
    adv: &Tensor,
    positive_weight: f64,
    negative_weight: f64,
) -> Result<Tensor> {
    let taper = taper_ratio.detach().clamp(0.0, 1.0)?.affine(negative_weight, 0.0)?;
    let pos = adv.ones_like()?.affine(positive_weight, 0.0)?;
    let weight = adv.gt(0.0)?.where_cond(&pos, &taper)?;
    Ok(weight.mul(&adv.detach())?.mul(logp)?.neg()?)
}

/// Per-token estimate of KL(π_off‖π_θ) from `x = log ρ` on a sample drawn
/// from the behaviour policy π_off:
///
/// - k1 = −x, k2 = ½x², k3 = eˣ − 1 − x (clamped to ±[`K3_CLAMP`]).
///
/// Why this direction: the data come from π_off, so Schulman's estimators
/// (sample q, ratio p/q) estimate KL(q‖p) = KL(π_off‖π_θ) — the direction of
/// TRPO's constraint and the paper's "forward KL" row of Table 1
/// (D_f(π_θ‖π_off) with f(u) = −log u), whose quadratic approximation is
/// ½·Var\[ρ\]. verl's k3 `e^{ref−logp} − (ref−logp) − 1` is the same formula
/// with the roles swapped because its samples come from π_θ. Because π_off
/// does not depend on θ, k1 and k3 give unbiased *gradients* too
/// (E_off\[(ρ−1)∇log π\] = −E_off\[∇log π\]); k2's gradient `x·∇log π` is that of
/// its own (second-order-equal) quantity. Since (ρ−1)² ≈ 2·k2 near ρ = 1,
/// the same λ pulls R²VPO about twice as hard as a KL penalty.
pub fn kl_estimate(k: KlEstimator, log_ratio: &Tensor) -> Result<Tensor> {
    Ok(match k {
        KlEstimator::K1 => log_ratio.neg()?,
        KlEstimator::K2 => log_ratio.sqr()?.affine(0.5, 0.0)?,
        KlEstimator::K3 => clamp_st(&log_ratio.exp()?.sub(log_ratio)?.affine(1.0, -1.0)?, -K3_CLAMP, K3_CLAMP)?,
    })
}

/// Scalar twin of [`kl_estimate`], for statistics.
pub fn kl_estimate_scalar(k: KlEstimator, x: f64) -> f64 {
    match k {
        KlEstimator::K1 => -x,
        KlEstimator::K2 => 0.5 * x * x,
        KlEstimator::K3 => (x.exp_m1() - x).clamp(-K3_CLAMP, K3_CLAMP),
    }
}

/// The paper's GRPO-KL per-token loss `ℓ = −ρ·A + λ·k(log ρ)`: R²VPO with its
/// ratio-variance term replaced by an empirical KL(π_off‖π_θ) penalty (see
/// [`kl_estimate`] for the direction and the estimators).
pub fn kl_penalty_per_token(
    ratio: &Tensor,
    log_ratio: &Tensor,
    adv: &Tensor,
    lambda: f64,
    k: KlEstimator,
) -> Result<Tensor> {
    Ok(is_pg_per_token(ratio, adv)?.add(&kl_estimate(k, log_ratio)?.affine(lambda, 0.0)?)?)
}

/// CISPO per-token loss (MiniMax-M1; TRL `loss_type="cispo"`):
/// `ℓ = −sg(min(ρ, c))·A·log π`. Every token keeps a gradient (none is
/// clipped away); the importance weight is capped instead.
pub fn cispo_per_token(logp: &Tensor, ratio: &Tensor, adv: &Tensor, cap: f64) -> Result<Tensor> {
    Ok(ratio.detach().clamp(f64::NEG_INFINITY, cap)?.mul(adv)?.mul(logp)?.neg()?)
}

/// SAPO per-token loss (Qwen 2025; TRL `loss_type="sapo"`):
/// `ℓ = −(4/τ)·σ(τ(ρ−1))·A`, with τ = τ₊ for A > 0 and τ₋ otherwise. The
/// gate's slope is 1 at ρ = 1 (the plain policy gradient) and decays
/// smoothly away from it, instead of dropping to 0 at a clip edge.
pub fn sapo_per_token(ratio: &Tensor, adv: &Tensor, tau_pos: f64, tau_neg: f64) -> Result<Tensor> {
    let tau =
        adv.gt(0.0)?.where_cond(&adv.ones_like()?.affine(tau_pos, 0.0)?, &adv.ones_like()?.affine(tau_neg, 0.0)?)?;
    let gate = candle_nn_free_sigmoid(&ratio.affine(1.0, -1.0)?.mul(&tau)?)?.affine(4.0, 0.0)?.div(&tau)?;
    Ok(gate.mul(adv)?.neg()?)
}

/// `1 / (1 + e^{−x})`, differentiable (candle-core has no sigmoid op of its
/// own; candle-nn's is not a dependency of the algorithm core).
fn candle_nn_free_sigmoid(x: &Tensor) -> Result<Tensor> {
    Ok(x.neg()?.exp()?.affine(1.0, 1.0)?.recip()?)
}

/// M2PO's second-moment mask (Zheng et al. 2025, Algorithm 1; AReaL's
/// `_get_m2po_loss_mask`): over the valid tokens, the largest `(log ρ)²` are
/// masked one by one until the mean of the rest is below `tau` (AReaL's
/// strict `<`; the paper's loop stops at ≤, which differs only at equality). Returns a
/// detached `(B, T)` 0/1 keep-mask (0 at invalid tokens too).
///
/// The bound is per micro-batch, as AReaL applies it (the paper states it
/// over the batch it trains on); at least one token is always kept, as in
/// AReaL. Ties are broken by position, so the mask is deterministic.
pub fn m2po_keep_mask(log_ratio: &Tensor, mask: &Tensor, tau: f64) -> Result<Tensor> {
    let (b, t) = log_ratio.dims2()?;
    let x: Vec<f64> = log_ratio.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
    let m: Vec<f64> = mask.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
    let mut valid: Vec<(f64, usize)> = (0..x.len()).filter(|&i| m[i] > 0.0).map(|i| (x[i] * x[i], i)).collect();
    let mut keep: Vec<f64> = m.iter().map(|&v| if v > 0.0 { 1.0 } else { 0.0 }).collect();
    // Largest first, ties by position.
    valid.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let n = valid.len();
    // Suffix means of valid[k..]; mask the first k whose suffix mean is
    // below τ, else all but the smallest.
    let mut suffix = 0.0;
    let mut means = vec![0.0; n];
    for k in (0..n).rev() {
        suffix += valid[k].0;
        means[k] = suffix / (n - k) as f64;
    }
    let cut = means.iter().position(|&mk| mk < tau).unwrap_or(n.saturating_sub(1));
    for &(_, i) in &valid[..cut] {
        keep[i] = 0.0;
    }
    Ok(Tensor::from_vec(keep, (b, t), log_ratio.device())?.to_dtype(log_ratio.dtype())?)
}

/// M2PO per-token loss `ℓ = −keep·ρ·A`: the paper's objective
/// `Σ M_{i,t}·ρ·A / Σ|o_i|` is unclipped; masked tokens stay in the
/// aggregation's normaliser (they count as zero loss, as in the paper).
pub fn m2po_per_token(ratio: &Tensor, adv: &Tensor, keep: &Tensor) -> Result<Tensor> {
    Ok(is_pg_per_token(ratio, adv)?.mul(keep)?)
}

/// The log-ratio-squared penalty `λ·(log ρ)²` (prime-rl's default loss
/// carries it with a fixed `kl_tau = 1e-3`): R²VPO's penalty with `ρ−1`
/// replaced by `log ρ`, equal to second order at ρ = 1 and symmetric in log
/// space, so a token at ρ = ½ is pulled back as hard as one at ρ = 2.
pub fn log_ratio_sq_penalty(log_ratio: &Tensor, lambda: f64) -> Result<Tensor> {
    Ok(log_ratio.sqr()?.affine(lambda, 0.0)?)
}

/// SPO's penalty `|A|/(2ε)·(ρ−1)²` (Xie et al. 2025, the objective
/// `ρÂ − |Â|/(2ε)(ρ−1)²`): its optimum in ρ for one token is `1 + ε·sign(A)`,
/// the edge of PPO's clip band, reached smoothly instead of by a cut.
pub fn spo_penalty(ratio: &Tensor, adv: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(ratio.affine(1.0, -1.0)?.sqr()?.mul(&adv.abs()?)?.affine(1.0 / (2.0 * eps), 0.0)?)
}

/// GSPO's sequence ratio with token-level gradients (verl
/// `compute_policy_loss_gspo`): `log s_{i,t} = sg(mean_t log ρ_{i,t}) +
/// log π_{i,t} − sg(log π_{i,t})`, so its value is the geometric mean of the
/// sequence's ratios and its gradient `s·∇log π_{i,t}`. The mean is over the
/// valid tokens of the row; `log s` is capped at [`GSPO_LOG_RATIO_CAP`] above
/// (verl's 10) and at `−c` below.
pub fn gspo_sequence_ratio(log_ratio: &Tensor, logp: &Tensor, mask: &Tensor, c: f64) -> Result<Tensor> {
    let mask = mask.to_dtype(log_ratio.dtype())?;
    let len = mask.sum_keepdim(D::Minus1)?.clamp(1.0, f64::INFINITY)?;
    let mean = log_ratio.detach().mul(&mask)?.sum_keepdim(D::Minus1)?.div(&len)?;
    let tok = logp.sub(&logp.detach())?.broadcast_add(&mean)?;
    Ok(clamp_st(&tok, -c, GSPO_LOG_RATIO_CAP.min(c))?.exp()?)
}

/// verl's upper cap on GSPO's log sequence ratio.
pub const GSPO_LOG_RATIO_CAP: f64 = 10.0;

/// DPPO's trust-region mask (Qi et al. 2026; verl `dppo_tv` / `dppo_kl`):
/// the divergence between the sampled token's probabilities `p = π_θ` and
/// `p_old` decides, per advantage sign, whether the token may still move.
///
/// - TV: keep if `p − p_old ≤ δ_h` (A > 0), `p − p_old ≥ −δ_l` (A ≤ 0).
/// - KL: the binary KL `p_old·log(p_old/p) + (1−p_old)·log((1−p_old)/(1−p))`
///   ≤ δ_h (A > 0) or δ_l (A ≤ 0), or the token has not moved in its
///   advantage's direction (`p ≤ p_old` for A > 0, `p ≥ p_old` otherwise).
///
/// Detached 0/1, 0 at invalid tokens.
pub fn dppo_keep_mask(
    logp: &Tensor,
    old_logp: &Tensor,
    adv: &Tensor,
    mask: &Tensor,
    kind: ObjectiveKind,
    delta_low: f64,
    delta_high: f64,
) -> Result<Tensor> {
    let p = logp.detach().exp()?;
    let p_old = old_logp.detach().exp()?;
    let diff = p.sub(&p_old)?;
    let pos = adv.gt(0.0)?;
    let keep = match kind {
        ObjectiveKind::DppoTv => pos.where_cond(&diff.le(delta_high)?, &diff.ge(-delta_low)?)?,
        _ => {
            // verl's binary KL, its 1e-8 included (it keeps the second log
            // finite when a probability reaches 1).
            let lp = logp.detach();
            let lq = old_logp.detach();
            let kl = p_old.mul(&lq.sub(&lp)?)?.add(
                &p_old
                    .affine(-1.0, 1.0 + 1e-8)?
                    .log()?
                    .sub(&p.affine(-1.0, 1.0 + 1e-8)?.log()?)?
                    .mul(&p_old.affine(-1.0, 1.0)?)?,
            )?;
            let keep_pos = kl.le(delta_high)?.maximum(&diff.le(0.0)?)?;
            let keep_neg = kl.le(delta_low)?.maximum(&diff.ge(0.0)?)?;
            pos.where_cond(&keep_pos, &keep_neg)?
        }
    };
    Ok(keep.to_dtype(logp.dtype())?.mul(&mask.to_dtype(logp.dtype())?)?)
}

/// DPPO per-token loss `ℓ = −keep·sg(min(ρ, c))·A·log π`: REINFORCE with
/// the (optionally truncated) ratio as a detached weight, on the tokens the
/// trust region keeps. `cap` is verl's `clip_ratio_c` (`None`: no truncation,
/// the authors' 10⁴).
pub fn dppo_per_token(logp: &Tensor, ratio: &Tensor, adv: &Tensor, keep: &Tensor, cap: Option<f64>) -> Result<Tensor> {
    let w = match cap {
        Some(c) => ratio.detach().clamp(f64::NEG_INFINITY, c)?,
        None => ratio.detach(),
    };
    Ok(w.mul(adv)?.mul(logp)?.mul(keep)?.neg()?)
}

/// Detached ratio statistics of `batch` under `cfg`'s clamps, clip widths and
/// KL estimator, computed in f64 on the host. `pg_loss` and `penalty` are left
/// at 0 (they need λ and the aggregation; [`ObjectiveConfig::loss`] fills them).
pub fn ratio_stats(batch: &PolicyBatch, cfg: &ObjectiveConfig) -> Result<RatioStats> {
    check_shapes(batch)?;
    let host =
        |t: &Tensor| -> Result<Vec<f64>> { Ok(t.detach().to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?) };
    let (logp, old, adv, mask) = (host(batch.logp)?, host(batch.old_logp)?, host(batch.advantages)?, host(batch.mask)?);
    let c = cfg.log_ratio_clamp;
    let (lo, hi) = (1.0 - cfg.eps_low, 1.0 + cfg.eps_high);
    let mut ratios = Vec::new();
    let (mut clamped, mut low, mut high, mut dual) = (0usize, 0usize, 0usize, 0usize);
    let (mut sum, mut sq_dev, mut k1, mut k3, mut kk, mut x2) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for i in 0..mask.len() {
        if mask[i] <= 0.0 {
            continue;
        }
        let raw = logp[i] - old[i];
        if raw.abs() > c {
            clamped += 1;
        }
        let x = raw.clamp(-c, c);
        let r = x.exp();
        ratios.push(r);
        sum += r;
        sq_dev += (r - 1.0) * (r - 1.0);
        k1 += -x;
        k3 += kl_estimate_scalar(KlEstimator::K3, x);
        kk += kl_estimate_scalar(cfg.kl_estimator, x);
        x2 += x * x;
        low += usize::from(r < lo);
        high += usize::from(r > hi);
        dual += usize::from(matches!(cfg.dual_clip, Some(cd) if adv[i] < 0.0 && r > cd));
    }
    let n = ratios.len();
    if n == 0 {
        return Ok(RatioStats::default());
    }
    let nf = n as f64;
    let mean = sum / nf;
    let var = ratios.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / nf;
    ratios.sort_unstable_by(f64::total_cmp);
    let sq_dev_mean = sq_dev / nf;
    Ok(RatioStats {
        tokens: nf,
        ratio_mean: mean,
        ratio_var: var,
        sq_dev_mean,
        ratio_min: ratios[0],
        ratio_max: ratios[n - 1],
        quantiles: QUANTILES.iter().map(|&q| (q, crate::stats::quantile_sorted(&ratios, q))).collect(),
        clip_frac_low: low as f64 / nf,
        clip_frac_high: high as f64 / nf,
        clip_frac_dual: dual as f64 / nf,
        approx_kl: k1 / nf,
        kl_k3: k3 / nf,
        log_ratio_clamped_frac: clamped as f64 / nf,
        masked_frac: 0.0,
        pg_loss: 0.0,
        penalty: 0.0,
        constraint: match cfg.kind {
            ObjectiveKind::KlPenalty => kk / nf,
            ObjectiveKind::LogRatioSq => x2 / nf,
            _ => sq_dev_mean,
        },
    })
}

/// `dual_clip` as TOML can write it: a number, or `"none"`/`"off"`/`false`
/// (also JSON `null`) for disabled. Serialises `None` as `"none"` so that a
/// written config reads back identically (an omitted key would mean the
/// default `Some(3.0)`).
mod dual_clip_serde {
    use super::fmt;
    use serde::{de, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> std::result::Result<S::Ok, S::Error> {
        match v {
            Some(c) => s.serialize_f64(*c),
            None => s.serialize_str("none"),
        }
    }

    struct V;

    impl<'de> de::Visitor<'de> for V {
        type Value = Option<f64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a number > 1, or \"none\" / false to disable dual-clip")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
            match v {
                "none" | "off" => Ok(None),
                _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
            }
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Self::Value, E> {
            if v {
                Err(E::invalid_value(de::Unexpected::Bool(v), &self))
            } else {
                Ok(None)
            }
        }
        fn visit_none<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Self::Value, D::Error> {
            d.deserialize_any(V)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Option<f64>, D::Error> {
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::PRESETS;
    use candle_core::{Device, Var};
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn mat(rows: &[Vec<f64>]) -> Tensor {
        let (b, t) = (rows.len(), rows[0].len());
        Tensor::from_vec(rows.concat(), (b, t), &Device::Cpu).unwrap()
    }

    fn row(v: &[f64]) -> Tensor {
        mat(&[v.to_vec()])
    }

    struct Run {
        loss: f64,
        grad: Vec<Vec<f64>>,
        per_token: Vec<Vec<f64>>,
        stats: RatioStats,
    }

    fn run(cfg: &ObjectiveConfig, logp: &Tensor, old: &Tensor, adv: &Tensor, mask: &Tensor, lambda: f64) -> Run {
        let var = Var::from_tensor(logp).unwrap();
        let global = GlobalBatch::from_mask(mask).unwrap();
        let batch = PolicyBatch { logp: var.as_tensor(), old_logp: old, advantages: adv, mask, weights: None };
        let out = cfg.loss(&batch, lambda, &global).unwrap();
        assert_eq!(out.loss.rank(), 0);
        let grads = out.loss.backward().unwrap();
        let grad = grads.get(var.as_tensor()).expect("logp must receive a gradient");
        let f64s = |t: &Tensor| t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap();
        Run {
            loss: out.loss.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap(),
            grad: f64s(grad),
            per_token: f64s(&out.per_token),
            stats: out.stats,
        }
    }

    /// One row of tokens with given ratios and advantages (old log-prob 0).
    fn run_ratios(cfg: &ObjectiveConfig, ratios: &[f64], adv: &[f64], lambda: f64) -> Run {
        let logp: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
        let n = ratios.len();
        run(cfg, &row(&logp), &row(&vec![0.0; n]), &row(adv), &row(&vec![1.0; n]), lambda)
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    #[track_caller]
    fn assert_close(a: f64, b: f64, tol: f64, what: &str) {
        assert!(close(a, b, tol), "{what}: {a} vs {b}");
    }

    fn clip_cfg(eps_low: f64, eps_high: f64, dual_clip: Option<f64>) -> ObjectiveConfig {
        ObjectiveConfig { kind: ObjectiveKind::Clip, eps_low, eps_high, dual_clip, ..ObjectiveConfig::default() }
    }

    struct RandBatch {
        logp: Vec<Vec<f64>>,
        old: Vec<Vec<f64>>,
        adv: Vec<Vec<f64>>,
        mask: Vec<Vec<f64>>,
    }

    fn random_batch(seed: u64, b: usize, t: usize, max_dev: f64) -> RandBatch {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut out = RandBatch { logp: vec![], old: vec![], adv: vec![], mask: vec![] };
        for _ in 0..b {
            let len = rng.random_range(1..=t);
            let logp: Vec<f64> = (0..t).map(|_| rng.random_range(-4.0..-0.05)).collect();
            out.old.push(logp.iter().map(|l| l - rng.random_range(-max_dev..max_dev)).collect());
            out.logp.push(logp);
            out.adv.push((0..t).map(|_| rng.random_range(-2.0..2.0)).collect());
            out.mask.push((0..t).map(|j| if j < len { 1.0 } else { 0.0 }).collect());
        }
        out
    }

    /// ∂(aggregated loss)/∂ℓ_{i,t} for a valid token: the aggregation weight.
    fn agg_weight(mode: Aggregation, mask: &[Vec<f64>], i: usize) -> f64 {
        let tokens: f64 = mask.iter().flatten().sum();
        let seqs = mask.iter().filter(|r| r.iter().sum::<f64>() > 0.0).count() as f64;
        let horizon = mask[0].len() as f64;
        let n_i: f64 = mask[i].iter().sum();
        match mode {
            Aggregation::TokenMean => 1.0 / tokens,
            Aggregation::SeqMeanTokenMean => 1.0 / (n_i * seqs),
            Aggregation::SeqMeanTokenSum => 1.0 / seqs,
            Aggregation::SeqMeanTokenSumNorm => 1.0 / (seqs * horizon),
        }
    }

    const ALL_MODES: [Aggregation; 4] = [
        Aggregation::TokenMean,
        Aggregation::SeqMeanTokenMean,
        Aggregation::SeqMeanTokenSum,
        Aggregation::SeqMeanTokenSumNorm,
    ];

    /// Eq. (gradient): ∂ℓ/∂log π = −(A − 2λ(ρ−1))·ρ, times the aggregation weight.
    #[test]
    fn r2vpo_gradient_matches_eq_gradient() {
        let rb = random_batch(7, 4, 6, 0.6);
        let (logp, old, adv, mask) = (mat(&rb.logp), mat(&rb.old), mat(&rb.adv), mat(&rb.mask));
        for lambda in [0.0, 0.04, 0.5, 3.0] {
            for mode in ALL_MODES {
                let cfg = ObjectiveConfig { aggregation: mode, ..ObjectiveConfig::default() };
                let out = run(&cfg, &logp, &old, &adv, &mask, lambda);
                let mut want_loss = 0.0;
                let mut want_pg = 0.0;
                for i in 0..4 {
                    let w = agg_weight(mode, &rb.mask, i);
                    for t in 0..6 {
                        let (a, r) = (rb.adv[i][t], (rb.logp[i][t] - rb.old[i][t]).exp());
                        if rb.mask[i][t] == 0.0 {
                            assert_eq!(out.grad[i][t], 0.0);
                            assert_eq!(out.per_token[i][t], 0.0);
                            continue;
                        }
                        let want = -(a - 2.0 * lambda * (r - 1.0)) * r * w;
                        assert_close(out.grad[i][t], want, 1e-12, &format!("grad λ={lambda} {mode:?} ({i},{t})"));
                        assert_close(out.per_token[i][t], -r * a + lambda * (r - 1.0).powi(2), 1e-12, "per-token");
                        want_loss += w * (-r * a + lambda * (r - 1.0).powi(2));
                        want_pg += w * (-r * a);
                    }
                }
                assert_close(out.loss, want_loss, 1e-12, "loss");
                assert_close(out.stats.pg_loss, want_pg, 1e-12, "pg_loss");
                assert_close(out.stats.pg_loss + out.stats.penalty, out.loss, 1e-12, "pg + penalty = loss");
                assert_close(out.stats.constraint, out.stats.sq_dev_mean, 0.0, "constraint is E[(ρ−1)²]");
            }
        }
        // The named function is what `loss` computes.
        let ratio = (logp.sub(&old).unwrap()).exp().unwrap();
        let named = r2vpo_per_token(&ratio, &adv, 0.5).unwrap().mul(&mask).unwrap().to_vec2::<f64>().unwrap();
        let out = run(&ObjectiveConfig::default(), &logp, &old, &adv, &mask, 0.5);
        for (a, b) in named.iter().flatten().zip(out.per_token.iter().flatten()) {
            assert_close(*a, *b, 1e-12, "r2vpo_per_token");
        }
    }

    #[test]
    fn clip_zeroes_gradient_exactly_in_clipped_regions() {
        // (ρ, A): clipped-high, clipped-low, pessimistic A>0, pessimistic A<0, dual-clip, inside.
        let ratios = [1.5, 0.5, 0.5, 1.5, 4.0, 1.1];
        let adv = [1.0, -1.0, 2.0, -1.0, -1.0, 0.7];
        let w = 1.0 / 6.0;
        let out = run_ratios(&clip_cfg(0.2, 0.2, Some(3.0)), &ratios, &adv, 0.0);
        let want_value = [-1.2, 0.8, -1.0, 1.5, 3.0, -0.77];
        let want_grad = [0.0, 0.0, -w, 1.5 * w, 0.0, -0.77 * w];
        for k in 0..6 {
            assert_close(out.per_token[0][k], want_value[k], 1e-12, &format!("value {k}"));
            assert_close(out.grad[0][k], want_grad[k], 1e-12, &format!("grad {k}"));
        }
        assert_close(out.loss, want_value.iter().sum::<f64>() * w, 1e-12, "loss");
        assert_close(out.stats.clip_frac_dual, 1.0 / 6.0, 1e-15, "dual frac");
        // Without dual-clip the exploded negative token is unbounded: −A·ρ, full gradient.
        let out = run_ratios(&clip_cfg(0.2, 0.2, None), &ratios, &adv, 0.0);
        assert_close(out.per_token[0][4], 4.0, 1e-12, "no dual value");
        assert_close(out.grad[0][4], 4.0 * w, 1e-12, "no dual grad");
        assert_eq!(out.stats.clip_frac_dual, 0.0);
    }

    #[test]
    fn clip_higher_is_asymmetric() {
        let sym = run_ratios(&clip_cfg(0.2, 0.2, Some(3.0)), &[1.25], &[1.0], 0.0);
        assert_close(sym.loss, -1.2, 1e-12, "clipped at 1.2");
        assert_eq!(sym.grad[0][0], 0.0);
        assert_eq!(sym.stats.clip_frac_high, 1.0);
        let ch = run_ratios(&ObjectiveConfig::preset("grpo-ch").unwrap(), &[1.25], &[1.0], 0.0);
        assert_close(ch.loss, -1.25, 1e-12, "inside 1.28");
        assert_close(ch.grad[0][0], -1.25, 1e-12, "grad inside");
        assert_eq!(ch.stats.clip_frac_high, 0.0);
        // The lower side is unchanged by clip-higher.
        let low = run_ratios(&ObjectiveConfig::preset("grpo-ch").unwrap(), &[0.75], &[-1.0], 0.0);
        assert_close(low.loss, 0.8, 1e-12, "low clip");
        assert_eq!(low.grad[0][0], 0.0);
    }

    #[test]
    fn gppo_keeps_bounded_gradient_where_clip_zeroes_it() {
        let (el, eh, b1, b2) = (0.2, 0.28, 0.25, 0.5);
        let cfg = ObjectiveConfig {
            kind: ObjectiveKind::Gppo,
            eps_low: el,
            eps_high: eh,
            gppo_beta1: b1,
            gppo_beta2: b2,
            ..ObjectiveConfig::default()
        };
        let ratios = [1.5, 0.5, 1.1, 4.0, 0.5, 1.5];
        let adv = [1.0, -1.0, 0.7, -1.0, 2.0, -1.0];
        let w = 1.0 / 6.0;
        let out = run_ratios(&cfg, &ratios, &adv, 0.0);
        let clip = run_ratios(&clip_cfg(el, eh, Some(3.0)), &ratios, &adv, 0.0);
        // Clipped regions: value = clip value × β, gradient −β(1±ε)·A·w.
        assert_close(out.per_token[0][0], b2 * clip.per_token[0][0], 1e-12, "high value");
        assert_close(out.per_token[0][0], -b2 * (1.0 + eh), 1e-12, "high value abs");
        assert_close(out.grad[0][0], -b2 * (1.0 + eh) * 1.0 * w, 1e-12, "high grad");
        assert_close(out.per_token[0][1], b1 * clip.per_token[0][1], 1e-12, "low value");
        // A = −1: −β₁(1−ε_l)·A·w = +β₁(1−ε_l)·w.
        assert_close(out.grad[0][1], b1 * (1.0 - el) * w, 1e-12, "low grad");
        assert_eq!(clip.grad[0][0], 0.0);
        assert_eq!(clip.grad[0][1], 0.0);
        // Inside, dual-clip and pessimistic tokens behave as in clip.
        for k in 2..6 {
            assert_close(out.per_token[0][k], clip.per_token[0][k], 1e-12, &format!("value {k}"));
            assert_close(out.grad[0][k], clip.grad[0][k], 1e-12, &format!("grad {k}"));
        }
        assert_eq!(out.grad[0][3], 0.0, "dual-clip still binds");
    }

    #[test]
    fn topr_gradients_token_and_sequence_level() {
        let logp = mat(&[vec![-1.0, -2.0, -0.5, -1.5], vec![-0.3, -0.7, -5.0, -5.0]]);
        let old = mat(&[vec![-1.2, -1.5, -0.9, -1.0], vec![-0.6, -0.8, -1.0, -1.0]]);
        let adv = mat(&[vec![1.0, 2.0, -1.0, -2.0], vec![-1.5, 0.0, 9.0, 9.0]]);
        let mask = mat(&[vec![1.0; 4], vec![1.0, 1.0, 0.0, 0.0]]);
        let (lp, ol, ad) =
            (logp.to_vec2::<f64>().unwrap(), old.to_vec2::<f64>().unwrap(), adv.to_vec2::<f64>().unwrap());
        let (wp, wn) = (1.0, 0.5);
        let w = 1.0 / 6.0;
        for level in [RatioLevel::Token, RatioLevel::Sequence] {
            let cfg = ObjectiveConfig {
                kind: ObjectiveKind::Topr,
                topr_ratio_level: level,
                topr_positive_weight: wp,
                topr_negative_weight: wn,
                ..ObjectiveConfig::default()
            };
            let out = run(&cfg, &logp, &old, &adv, &mask, 0.0);
            let seq_log = [0.2 - 0.5 + 0.4 - 0.5, 0.3 + 0.1];
            for i in 0..2 {
                for t in 0..4 {
                    if i == 1 && t >= 2 {
                        assert_eq!(out.grad[i][t], 0.0);
                        continue;
                    }
                    let a = ad[i][t];
                    let rho = match level {
                        RatioLevel::Token => (lp[i][t] - ol[i][t]).exp(),
                        RatioLevel::Sequence => f64::exp(seq_log[i]),
                    };
                    let coef = if a > 0.0 { wp } else { wn * rho.clamp(0.0, 1.0) };
                    assert_close(out.grad[i][t], -coef * a * w, 1e-12, &format!("{level:?} grad ({i},{t})"));
                    assert_close(
                        out.per_token[i][t],
                        -coef * a * lp[i][t],
                        1e-12,
                        &format!("{level:?} value ({i},{t})"),
                    );
                }
            }
            // Token 2 of row 0 (ρ = e^0.4 > 1, A < 0) separates the levels:
            // the token taper is 1, the sequence taper e^−0.4.
            let want = match level {
                RatioLevel::Token => wn * w,
                RatioLevel::Sequence => wn * f64::exp(-0.4) * w,
            };
            assert_close(out.grad[0][2], want, 1e-12, "level-dependent taper");
        }
    }

    #[test]
    fn kl_estimators_match_hand_values_and_gradients() {
        let xs = [-12.0, -1.0, -0.1, 0.0, 0.3, 3.0];
        let x = row(&xs);
        let hand = |k: KlEstimator, x: f64| -> (f64, f64) {
            match k {
                KlEstimator::K1 => (-x, -1.0),
                KlEstimator::K2 => (0.5 * x * x, x),
                KlEstimator::K3 => {
                    let v = x.exp() - 1.0 - x;
                    if v > 10.0 {
                        (10.0, 0.0)
                    } else {
                        (v, x.exp() - 1.0)
                    }
                }
            }
        };
        // Spot values worked by hand.
        let k3 = kl_estimate(KlEstimator::K3, &x).unwrap().to_vec2::<f64>().unwrap()[0].clone();
        assert_close(k3[1], (-1.0f64).exp(), 1e-12, "k3(−1) = e^−1");
        assert_eq!(k3[0], 10.0, "k3(−12) = 11.000006 clamps to 10");
        assert_eq!(k3[5], 10.0, "k3(3) = 16.09 clamps to 10");
        assert_eq!(k3[3], 0.0);
        let lambda = 0.3;
        let n = xs.len() as f64;
        for k in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
            let vals = kl_estimate(k, &x).unwrap().to_vec2::<f64>().unwrap()[0].clone();
            // A = 0 isolates the penalty: ∂(λ·k)/∂log π = λ·k'(x).
            let cfg = ObjectiveConfig { kind: ObjectiveKind::KlPenalty, kl_estimator: k, ..ObjectiveConfig::default() };
            let out = run(&cfg, &x, &row(&[0.0; 6]), &row(&[0.0; 6]), &row(&[1.0; 6]), lambda);
            let mut mean = 0.0;
            for (j, &xj) in xs.iter().enumerate() {
                let (v, d) = hand(k, xj);
                assert_close(vals[j], v, 1e-12, &format!("{k:?} value at {xj}"));
                assert_close(kl_estimate_scalar(k, xj), v, 1e-12, &format!("{k:?} scalar at {xj}"));
                assert_close(out.grad[0][j], lambda * d / n, 1e-12, &format!("{k:?} grad at {xj}"));
                mean += v / n;
            }
            assert_close(out.stats.constraint, mean, 1e-12, "constraint = E[k]");
            assert_close(out.stats.penalty, lambda * mean, 1e-12, "penalty");
            assert_close(out.stats.pg_loss, 0.0, 0.0, "pg part");
        }
        // With an advantage, the full GRPO-KL gradient is −A·ρ + λ·k'.
        let cfg = ObjectiveConfig::preset("grpo-kl").unwrap();
        let out = run(&cfg, &row(&[0.3]), &row(&[0.0]), &row(&[1.5]), &row(&[1.0]), lambda);
        let r = 0.3f64.exp();
        assert_close(out.grad[0][0], -1.5 * r + lambda * (r - 1.0), 1e-12, "grpo-kl grad");
        let named = kl_penalty_per_token(&row(&[r]), &row(&[0.3]), &row(&[1.5]), lambda, KlEstimator::K3).unwrap();
        assert_close(named.to_vec2::<f64>().unwrap()[0][0], out.per_token[0][0], 1e-12, "kl_penalty_per_token");
    }

    fn kind(kind: ObjectiveKind) -> ObjectiveConfig {
        ObjectiveConfig { kind, ..ObjectiveConfig::default() }
    }

    /// The 2026 menu's per-token losses and gradients against their
    /// formulas, written out here in scalars (one row, old log-prob 0, so
    /// `x = log ρ = log π`, token-mean weight 1/n).
    #[test]
    fn menu_losses_match_scalar_formulas() {
        let ratios = [1.6, 0.7, 1.05, 0.4, 2.5];
        let adv = [1.0, -0.5, 0.8, 1.2, -1.5];
        let n = ratios.len() as f64;
        let check = |cfg: &ObjectiveConfig, lambda: f64, f: &dyn Fn(f64, f64) -> (f64, f64)| {
            let out = run_ratios(cfg, &ratios, &adv, lambda);
            let mut loss = 0.0;
            for k in 0..ratios.len() {
                let (v, d) = f(ratios[k], adv[k]);
                assert_close(out.per_token[0][k], v, 1e-12, &format!("{:?} value {k}", cfg.kind));
                assert_close(out.grad[0][k], d / n, 1e-12, &format!("{:?} grad {k}", cfg.kind));
                loss += v / n;
            }
            assert_close(out.loss, loss, 1e-12, &format!("{:?} loss", cfg.kind));
            out
        };
        // ρÂ − λ(log ρ)²: ∂/∂x = −ρA + 2λx; its dual statistic is E[x²].
        let lam = 0.3;
        let out = check(&kind(ObjectiveKind::LogRatioSq), lam, &|r: f64, a| {
            (-r * a + lam * r.ln().powi(2), -r * a + 2.0 * lam * r.ln())
        });
        let ex2 = ratios.iter().map(|r: &f64| r.ln().powi(2)).sum::<f64>() / n;
        assert_close(out.stats.constraint, ex2, 1e-12, "log-ratio-sq constraint");
        // SPO: −ρA + |A|/(2ε)(ρ−1)², ∂/∂x = (−A + |A|(ρ−1)/ε)·ρ.
        let eps = 0.2;
        check(&kind(ObjectiveKind::Spo), 0.0, &|r: f64, a: f64| {
            (-r * a + a.abs() / (2.0 * eps) * (r - 1.0).powi(2), (-a + a.abs() * (r - 1.0) / eps) * r)
        });
        // CISPO at cap 1.5: −min(ρ, 1.5)·A·log π, gradient −min(ρ, 1.5)·A.
        let cispo = ObjectiveConfig { cispo_cap: 1.5, ..kind(ObjectiveKind::Cispo) };
        check(&cispo, 0.0, &|r: f64, a| (-r.min(1.5) * a * r.ln(), -r.min(1.5) * a));
        // SAPO: −(4/τ)σ(τ(ρ−1))A, gradient −4σ(1−σ)·ρ·A.
        check(&kind(ObjectiveKind::Sapo), 0.0, &|r: f64, a: f64| {
            let tau = if a > 0.0 { 1.0 } else { 1.05 };
            let sig = 1.0 / (1.0 + (-tau * (r - 1.0)).exp());
            (-(4.0 / tau) * sig * a, -4.0 * sig * (1.0 - sig) * r * a)
        });
        // GSPO on one row: the sequence ratio s = exp(mean x) for every
        // token, clipped PPO-style; the gradient −A·s on the active side.
        let s_ratio = (ratios.iter().map(|r: &f64| r.ln()).sum::<f64>() / n).exp();
        for (lo, hi) in [(0.2, 0.2), (3e-4, 4e-4)] {
            let cfg = ObjectiveConfig { eps_low: lo, eps_high: hi, ..kind(ObjectiveKind::Gspo) };
            check(&cfg, 0.0, &|_r, a: f64| {
                let c = s_ratio.clamp(1.0 - lo, 1.0 + hi);
                if -a * s_ratio >= -a * c {
                    (-a * s_ratio, -a * s_ratio)
                } else {
                    (-a * c, 0.0)
                }
            });
        }
    }

    #[test]
    fn dppo_masks_by_the_sampled_tokens_probability() {
        // p_old = 0.5 everywhere; (p, A) pairs on each side of the regions.
        let probs = [0.6, 0.7, 0.3, 0.45, 0.9, 0.52];
        let adv = [1.0, 1.0, -1.0, -1.0, -2.0, 0.5];
        let logp = row(&probs.map(f64::ln));
        let old = row(&[0.5f64.ln(); 6]);
        let n = 6.0;
        for (k, delta) in [(ObjectiveKind::DppoTv, 0.15), (ObjectiveKind::DppoKl, 0.05)] {
            let cfg = ObjectiveConfig { eps_low: delta, eps_high: delta, dual_clip: Some(1.5), ..kind(k) };
            let out = run(&cfg, &logp, &old, &row(&adv), &row(&[1.0; 6]), 0.0);
            let mut dropped = 0.0;
            for j in 0..6 {
                let (p, q, a) = (probs[j], 0.5f64, adv[j]);
                let keep = match k {
                    ObjectiveKind::DppoTv => {
                        if a > 0.0 {
                            p - q <= delta
                        } else {
                            p - q >= -delta
                        }
                    }
                    _ => {
                        let kl = q * (q.ln() - p.ln()) + (1.0 - q) * ((1.0 - q + 1e-8) / (1.0 - p + 1e-8)).ln();
                        if a > 0.0 {
                            kl <= delta || p <= q
                        } else {
                            kl <= delta || p >= q
                        }
                    }
                };
                dropped += f64::from(u8::from(!keep));
                let w = if keep { (p / q).min(1.5) } else { 0.0 };
                assert_close(out.grad[0][j], -w * a / n, 1e-12, &format!("{k:?} grad {j}"));
                assert_close(out.per_token[0][j], -w * a * p.ln(), 1e-12, &format!("{k:?} value {j}"));
            }
            assert!(dropped > 0.0 && dropped < 6.0, "{k:?}: the cases straddle the region");
            assert_close(out.stats.masked_frac, dropped / n, 1e-12, "masked fraction");
        }
    }

    #[test]
    fn m2po_masks_the_largest_second_moments_until_the_bound_holds() {
        // x² = 0.25, 0.09, 0.01, 0, 0.0025: mean 0.0705 > 0.04; without the
        // 0.25 the mean is 0.025625 < 0.04, so exactly token 0 goes.
        let xs = [0.5, -0.3, 0.1, 0.0, 0.05];
        let adv = [1.0, -1.0, 0.5, 2.0, -0.5];
        let ratios = xs.map(f64::exp);
        let out = run_ratios(&kind(ObjectiveKind::M2po), &ratios, &adv, 0.0);
        assert_eq!(out.grad[0][0], 0.0);
        assert_eq!(out.per_token[0][0], 0.0);
        for k in 1..5 {
            assert_close(out.grad[0][k], -ratios[k] * adv[k] / 5.0, 1e-12, "kept token: −ρA/n");
        }
        assert_close(out.stats.masked_frac, 0.2, 1e-15, "one of five masked");
        // A tighter bound takes the next largest too; a loose one keeps all.
        let tight = ObjectiveConfig { m2po_tau: 0.01, ..kind(ObjectiveKind::M2po) };
        let out = run_ratios(&tight, &ratios, &adv, 0.0);
        assert_eq!((out.grad[0][0], out.grad[0][1]), (0.0, 0.0));
        assert!(out.grad[0][2] != 0.0);
        let loose = ObjectiveConfig { m2po_tau: 0.1, ..kind(ObjectiveKind::M2po) };
        assert_eq!(run_ratios(&loose, &ratios, &adv, 0.0).stats.masked_frac, 0.0);
        // At least one token always stays (AReaL).
        let none = ObjectiveConfig { m2po_tau: 1e-9, ..kind(ObjectiveKind::M2po) };
        assert_close(run_ratios(&none, &ratios, &adv, 0.0).stats.masked_frac, 0.8, 1e-15, "n − 1 masked");
    }

    #[test]
    fn correction_weights_multiply_the_policy_gradient_term_only() {
        let logp = row(&[0.2, -0.1, 0.3]);
        let zeros = row(&[0.0; 3]);
        let adv = row(&[1.0, -1.0, 0.5]);
        let mask = row(&[1.0; 3]);
        let w = row(&[0.5, 2.0, 0.0]);
        let var = Var::from_tensor(&logp).unwrap();
        let global = GlobalBatch::from_mask(&mask).unwrap();
        let cfg = ObjectiveConfig::default();
        let batch =
            PolicyBatch { logp: var.as_tensor(), old_logp: &zeros, advantages: &adv, mask: &mask, weights: Some(&w) };
        let out = cfg.loss(&batch, 0.4, &global).unwrap();
        let grad = out.loss.backward().unwrap().get(var.as_tensor()).unwrap().to_vec2::<f64>().unwrap();
        for (k, (x, a, wk)) in [(0.2f64, 1.0, 0.5), (-0.1, -1.0, 2.0), (0.3, 0.5, 0.0)].into_iter().enumerate() {
            let r = x.exp();
            // −w·ρA + λ(ρ−1)²: the penalty is not weighted.
            assert_close(grad[0][k], (-wk * r * a + 0.4 * 2.0 * (r - 1.0) * r) / 3.0, 1e-12, &format!("grad {k}"));
        }
    }

    fn vecs(b: usize, t: usize, lo: f64, hi: f64) -> impl Strategy<Value = Vec<Vec<f64>>> {
        prop::collection::vec(prop::collection::vec(lo..hi, t), b)
    }

    fn masks(b: usize, t: usize) -> impl Strategy<Value = Vec<Vec<f64>>> {
        prop::collection::vec(
            prop::collection::vec(prop::bool::weighted(0.8).prop_map(|m| if m { 1.0 } else { 0.0 }), t),
            b,
        )
    }

    type Grid = Vec<Vec<f64>>;

    /// (logp, log-ratio, adv, mask) of a random (B, T) batch.
    fn batches(dev: f64) -> impl Strategy<Value = (Grid, Grid, Grid, Grid)> {
        (1usize..4, 1usize..6).prop_flat_map(move |(b, t)| {
            (vecs(b, t, -5.0, -0.01), vecs(b, t, -dev, dev), vecs(b, t, -3.0, 3.0), masks(b, t))
        })
    }

    #[track_caller]
    fn assert_same_run(a: &Run, b: &Run, tol: f64) {
        assert_close(a.loss, b.loss, tol, "loss");
        for (ra, rb) in a.grad.iter().zip(&b.grad) {
            for (x, y) in ra.iter().zip(rb) {
                assert_close(*x, *y, tol, "grad");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn is_pg_equals_r2vpo_at_zero_lambda((logp, lr, adv, mask) in batches(2.0), mode_ix in 0usize..4) {
            let old: Vec<Vec<f64>> = logp.iter().zip(&lr).map(|(l, d)| l.iter().zip(d).map(|(a, b)| a - b).collect()).collect();
            let (logp, old, adv, mask) = (mat(&logp), mat(&old), mat(&adv), mat(&mask));
            let aggregation = ALL_MODES[mode_ix];
            let is = ObjectiveConfig { kind: ObjectiveKind::IsPg, aggregation, ..ObjectiveConfig::default() };
            let r2 = ObjectiveConfig { aggregation, ..ObjectiveConfig::default() };
            let a = run(&is, &logp, &old, &adv, &mask, 0.7);
            let b = run(&r2, &logp, &old, &adv, &mask, 0.0);
            assert_same_run(&a, &b, 1e-13);
            prop_assert_eq!(b.stats.penalty, 0.0);
        }

        #[test]
        fn clip_and_gppo_equal_unclipped_inside_the_band((logp, lr, adv, mask) in batches(1.0)) {
            let (el, eh): (f64, f64) = (0.2, 0.28);
            // Map the log-ratios strictly inside [ln(1−ε_l), ln(1+ε_h)].
            let (a, b) = ((1.0 - el).ln() + 1e-9, (1.0 + eh).ln() - 1e-9);
            let old: Vec<Vec<f64>> = logp.iter().zip(&lr).map(|(l, d)| l.iter().zip(d).map(|(x, u)| x - (a + (u + 1.0) / 2.0 * (b - a))).collect()).collect();
            let (logp, old, adv, mask) = (mat(&logp), mat(&old), mat(&adv), mat(&mask));
            let is = run(&ObjectiveConfig { kind: ObjectiveKind::IsPg, ..ObjectiveConfig::default() }, &logp, &old, &adv, &mask, 0.0);
            let clip = run(&clip_cfg(el, eh, Some(3.0)), &logp, &old, &adv, &mask, 0.0);
            let gppo = run(&ObjectiveConfig::preset("gppo").unwrap(), &logp, &old, &adv, &mask, 0.0);
            assert_same_run(&is, &clip, 1e-13);
            assert_same_run(&is, &gppo, 1e-13);
            prop_assert_eq!(clip.stats.clip_frac_low + clip.stats.clip_frac_high, 0.0);
        }
    }

    #[test]
    fn log_ratio_is_clamped_and_reported() {
        let cfg = ObjectiveConfig { kind: ObjectiveKind::IsPg, ..ObjectiveConfig::default() };
        let out = run(&cfg, &row(&[50.0, 0.1, -50.0]), &row(&[0.0; 3]), &row(&[1.0, 1.0, 1.0]), &row(&[1.0; 3]), 0.0);
        assert_close(out.per_token[0][0], -(20.0f64).exp(), 1e-12, "ρ = e^20");
        assert_close(out.per_token[0][2], -(-20.0f64).exp(), 1e-12, "ρ = e^−20");
        assert_eq!(out.grad[0][0], 0.0, "no gradient beyond the clamp");
        assert_eq!(out.grad[0][2], 0.0);
        assert_close(out.grad[0][1], -(0.1f64).exp() / 3.0, 1e-12, "gradient inside");
        assert_close(out.stats.log_ratio_clamped_frac, 2.0 / 3.0, 1e-15, "clamped fraction");
        assert_close(out.stats.ratio_max, (20.0f64).exp(), 1e-12, "max");
        assert_close(out.stats.approx_kl, -(20.0 + 0.1 - 20.0) / 3.0, 1e-12, "approx_kl uses clamped log ρ");
        // Exactly on the bound the gradient is whole (torch.clamp convention).
        let edge = ObjectiveConfig { log_ratio_clamp: 0.5, ..cfg };
        let out = run(&edge, &row(&[0.5]), &row(&[0.0]), &row(&[1.0]), &row(&[1.0]), 0.0);
        assert_close(out.grad[0][0], -(0.5f64).exp(), 1e-12, "gradient on the bound");
        assert_eq!(out.stats.log_ratio_clamped_frac, 0.0);
    }

    #[test]
    fn stats_match_hand_values() {
        // Ratios 0.5, 1, 1.5, 2 plus a masked fifth token full of garbage.
        let logp = row(&[0.5f64.ln(), 0.0, 1.5f64.ln(), 2.0f64.ln(), f64::NAN]);
        let old = row(&[0.0, 0.0, 0.0, 0.0, f64::NEG_INFINITY]);
        let adv = row(&[1.0, 1.0, -1.0, -1.0, 1e9]);
        let mask = row(&[1.0, 1.0, 1.0, 1.0, 0.0]);
        let cfg = ObjectiveConfig { dual_clip: Some(1.8), ..ObjectiveConfig::default() };
        let s = run(&cfg, &logp, &old, &adv, &mask, 0.1).stats;
        let tol = 1e-12;
        assert_eq!(s.tokens, 4.0);
        assert_close(s.ratio_mean, 1.25, tol, "mean");
        assert_close(s.ratio_var, 0.3125, tol, "var");
        assert_close(s.sq_dev_mean, 0.375, tol, "E[(ρ−1)²]");
        assert_close(s.constraint, 0.375, tol, "constraint");
        assert_close(s.ratio_min, 0.5, tol, "min");
        assert_close(s.ratio_max, 2.0, tol, "max");
        let want_q = [0.515, 0.575, 0.875, 1.25, 1.625, 1.925, 1.985];
        assert_eq!(s.quantiles.len(), 7);
        for ((q, v), (wq, wv)) in s.quantiles.iter().zip(QUANTILES.iter().zip(want_q)) {
            assert_eq!(q, wq);
            assert_close(*v, wv, tol, &format!("q{q}"));
        }
        assert_close(s.clip_frac_low, 0.25, tol, "low");
        assert_close(s.clip_frac_high, 0.5, tol, "high");
        assert_close(s.clip_frac_dual, 0.25, tol, "dual: A<0 and ρ=2 > 1.8");
        assert_close(s.approx_kl, -(1.5f64).ln() / 4.0, tol, "approx_kl");
        let k3: f64 = [0.5f64, 1.0, 1.5, 2.0].iter().map(|r| r - 1.0 - r.ln()).sum::<f64>() / 4.0;
        assert_close(s.kl_k3, k3, tol, "k3");
        assert_close(s.penalty, 0.1 * 0.375, tol, "penalty = λ·E[(ρ−1)²] under token-mean");
        assert_close(s.pg_loss, -(0.5 + 1.0 - 1.5 - 2.0) / 4.0, tol, "pg");
        assert_eq!(s.log_ratio_clamped_frac, 0.0);
        // The public helper gives the same ratio statistics.
        let direct = ratio_stats(
            &PolicyBatch { logp: &logp, old_logp: &old, advantages: &adv, mask: &mask, weights: None },
            &cfg,
        )
        .unwrap();
        assert_eq!(RatioStats { pg_loss: s.pg_loss, penalty: s.penalty, ..direct }, s);
        // No unmasked token: zeros, no quantiles.
        let empty = ratio_stats(
            &PolicyBatch { logp: &logp, old_logp: &old, advantages: &adv, mask: &row(&[0.0; 5]), weights: None },
            &cfg,
        )
        .unwrap();
        assert_eq!(empty, RatioStats::default());
    }

    fn all_kinds() -> Vec<ObjectiveConfig> {
        let mut v: Vec<ObjectiveConfig> = PRESETS.iter().map(|p| ObjectiveConfig::preset(p).unwrap()).collect();
        v.push(ObjectiveConfig { topr_ratio_level: RatioLevel::Sequence, ..ObjectiveConfig::preset("topr").unwrap() });
        for k in [KlEstimator::K1, KlEstimator::K2] {
            v.push(ObjectiveConfig { kl_estimator: k, ..ObjectiveConfig::preset("grpo-kl").unwrap() });
        }
        v
    }

    #[test]
    fn masked_tokens_never_affect_loss_gradient_or_stats() {
        let rb = random_batch(11, 3, 5, 0.5);
        let garbage = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e6, -1e6];
        let dirty = |m: &Vec<Vec<f64>>, shift: usize| -> Tensor {
            let rows: Vec<Vec<f64>> = m
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    r.iter()
                        .enumerate()
                        .map(|(t, v)| if rb.mask[i][t] == 0.0 { garbage[(i + t + shift) % 5] } else { *v })
                        .collect()
                })
                .collect();
            mat(&rows)
        };
        let mask = mat(&rb.mask);
        for cfg in all_kinds() {
            for mode in ALL_MODES {
                let cfg = ObjectiveConfig { aggregation: mode, ..cfg.clone() };
                let clean = run(&cfg, &mat(&rb.logp), &mat(&rb.old), &mat(&rb.adv), &mask, 0.3);
                let noisy = run(&cfg, &dirty(&rb.logp, 0), &dirty(&rb.old, 1), &dirty(&rb.adv, 2), &mask, 0.3);
                assert!(noisy.loss.is_finite(), "{:?}", cfg.kind);
                assert_eq!(clean.loss, noisy.loss, "{:?} {mode:?}", cfg.kind);
                assert_eq!(clean.grad, noisy.grad, "{:?} {mode:?}", cfg.kind);
                assert_eq!(clean.per_token, noisy.per_token);
                assert_eq!(clean.stats, noisy.stats);
                for (i, r) in noisy.grad.iter().enumerate() {
                    for (t, g) in r.iter().enumerate() {
                        if rb.mask[i][t] == 0.0 {
                            assert_eq!(*g, 0.0);
                            assert_eq!(noisy.per_token[i][t], 0.0);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn f32_agrees_with_f64() {
        let rb = random_batch(3, 3, 7, 0.4);
        let ts = |dt: DType| -> Vec<Tensor> {
            [&rb.logp, &rb.old, &rb.adv, &rb.mask].iter().map(|m| mat(m).to_dtype(dt).unwrap()).collect()
        };
        let (a, b) = (ts(DType::F64), ts(DType::F32));
        for cfg in all_kinds() {
            let r64 = run(&cfg, &a[0], &a[1], &a[2], &a[3], 0.2);
            let r32 = run(&cfg, &b[0], &b[1], &b[2], &b[3], 0.2);
            assert_same_run(&r64, &r32, 1e-5);
        }
    }

    #[test]
    fn merged_micro_batch_stats_equal_full_batch_stats() {
        let rb = random_batch(5, 4, 6, 0.7);
        let cfg = ObjectiveConfig { aggregation: Aggregation::SeqMeanTokenMean, ..ObjectiveConfig::default() };
        let (logp, old, adv, mask) = (mat(&rb.logp), mat(&rb.old), mat(&rb.adv), mat(&rb.mask));
        let full = cfg
            .loss(
                &PolicyBatch { logp: &logp, old_logp: &old, advantages: &adv, mask: &mask, weights: None },
                0.4,
                &GlobalBatch::from_mask(&mask).unwrap(),
            )
            .unwrap();
        let part = |s: usize, n: usize| -> Vec<Tensor> {
            [&logp, &old, &adv, &mask].iter().map(|t| t.narrow(0, s, n).unwrap()).collect()
        };
        let (p1, p2) = (part(0, 1), part(1, 3));
        let global = GlobalBatch::from_masks(&[&p1[3], &p2[3]]).unwrap();
        let stats: Vec<RatioStats> = [p1, p2]
            .iter()
            .map(|p| {
                cfg.loss(
                    &PolicyBatch { logp: &p[0], old_logp: &p[1], advantages: &p[2], mask: &p[3], weights: None },
                    0.4,
                    &global,
                )
                .unwrap()
                .stats
            })
            .collect();
        let merged = RatioStats::merge(&stats);
        let f = &full.stats;
        assert_eq!(merged.tokens, f.tokens);
        for (a, b, what) in [
            (merged.ratio_mean, f.ratio_mean, "mean"),
            (merged.ratio_var, f.ratio_var, "var"),
            (merged.sq_dev_mean, f.sq_dev_mean, "sq_dev"),
            (merged.ratio_min, f.ratio_min, "min"),
            (merged.ratio_max, f.ratio_max, "max"),
            (merged.clip_frac_low, f.clip_frac_low, "low"),
            (merged.clip_frac_high, f.clip_frac_high, "high"),
            (merged.clip_frac_dual, f.clip_frac_dual, "dual"),
            (merged.approx_kl, f.approx_kl, "kl"),
            (merged.kl_k3, f.kl_k3, "k3"),
            (merged.constraint, f.constraint, "constraint"),
            (merged.pg_loss, f.pg_loss, "pg"),
            (merged.penalty, f.penalty, "penalty"),
        ] {
            assert_close(a, b, 1e-12, what);
        }
        assert_eq!(merged.quantiles.len(), QUANTILES.len());
        assert_eq!(RatioStats::merge(&[]), RatioStats::default());
    }

    #[test]
    fn presets_are_valid_and_distinct() {
        for name in PRESETS {
            ObjectiveConfig::preset(name).unwrap().validate().unwrap();
        }
        assert_eq!(ObjectiveConfig::preset("r2vpo").unwrap(), ObjectiveConfig::default());
        // PPO is clipping without dual-clip (Schulman et al. 2017; CleanRL);
        // GRPO adds verl's dual-clip 3. They once shared one preset.
        let ppo = ObjectiveConfig::preset("ppo").unwrap();
        assert_eq!((ppo.kind, ppo.dual_clip), (ObjectiveKind::Clip, None));
        let grpo = ObjectiveConfig::preset("grpo").unwrap();
        assert_eq!(
            (grpo.kind, grpo.eps_low, grpo.eps_high, grpo.dual_clip),
            (ObjectiveKind::Clip, 0.2, 0.2, Some(3.0))
        );
        let ch = ObjectiveConfig::preset("grpo-ch").unwrap();
        assert_eq!((ch.kind, ch.eps_low, ch.eps_high), (ObjectiveKind::Clip, 0.2, 0.28));
        let g = ObjectiveConfig::preset("gppo").unwrap();
        assert_eq!(
            (g.kind, g.eps_high, g.gppo_beta1, g.gppo_beta2, g.dual_clip),
            (ObjectiveKind::Gppo, 0.28, 0.25, 1.0, Some(3.0))
        );
        assert_eq!(ObjectiveConfig::preset("topr").unwrap().topr_ratio_level, RatioLevel::Token);
        assert_eq!(ObjectiveConfig::preset("grpo-kl").unwrap().kl_estimator, KlEstimator::K3);
        assert_eq!(ObjectiveConfig::preset("is-pg").unwrap().kind, ObjectiveKind::IsPg);
        match ObjectiveConfig::preset("dapo") {
            Err(Error::InvalidConfig { field, message }) => {
                assert_eq!(field, "algo");
                for name in PRESETS {
                    assert!(message.contains(name), "{message}");
                }
            }
            other => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn validate_names_the_offending_field() {
        let d = ObjectiveConfig::default;
        let cases: Vec<(ObjectiveConfig, &str)> = vec![
            (ObjectiveConfig { eps_low: 0.0, ..d() }, "objective.eps_low"),
            (ObjectiveConfig { eps_low: 1.0, ..d() }, "objective.eps_low"),
            (ObjectiveConfig { eps_high: -0.1, ..d() }, "objective.eps_high"),
            (ObjectiveConfig { eps_high: f64::NAN, ..d() }, "objective.eps_high"),
            (ObjectiveConfig { dual_clip: Some(1.0), ..d() }, "objective.dual_clip"),
            (ObjectiveConfig { dual_clip: Some(0.5), ..d() }, "objective.dual_clip"),
            (ObjectiveConfig { gppo_beta1: -1.0, ..d() }, "objective.gppo_beta1"),
            (ObjectiveConfig { gppo_beta2: f64::INFINITY, ..d() }, "objective.gppo_beta2"),
            (ObjectiveConfig { topr_positive_weight: -0.5, ..d() }, "objective.topr_positive_weight"),
            (ObjectiveConfig { topr_negative_weight: f64::NAN, ..d() }, "objective.topr_negative_weight"),
            (ObjectiveConfig { log_ratio_clamp: 0.0, ..d() }, "objective.log_ratio_clamp"),
            (ObjectiveConfig { log_ratio_clamp: 100.0, ..d() }, "objective.log_ratio_clamp"),
        ];
        let one = row(&[0.0]);
        let batch = PolicyBatch { logp: &one, old_logp: &one, advantages: &one, mask: &one, weights: None };
        let g = GlobalBatch::from_mask(&one).unwrap();
        for (cfg, want) in cases {
            for res in [cfg.validate(), cfg.loss(&batch, 0.0, &g).map(|_| ())] {
                match res {
                    Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, want),
                    other => panic!("{want}: expected InvalidConfig, got {other:?}"),
                }
            }
        }
        ObjectiveConfig { dual_clip: None, ..d() }.validate().unwrap();
        // λ must be a valid multiplier where it is used, and is ignored elsewhere.
        for bad in [-0.1, f64::NAN] {
            assert!(matches!(d().loss(&batch, bad, &g), Err(Error::InvalidConfig { field, .. }) if field == "lambda"));
            assert!(ObjectiveConfig::preset("grpo-kl").unwrap().loss(&batch, bad, &g).is_err());
            ObjectiveConfig::preset("grpo").unwrap().loss(&batch, bad, &g).unwrap();
        }
        assert!(matches!(clip_per_token(&one, &one, 0.2, 0.2, Some(1.0)), Err(Error::InvalidConfig { .. })));
    }

    #[test]
    fn shape_mismatch_is_an_error() {
        let a = Tensor::zeros((2, 3), DType::F64, &Device::Cpu).unwrap();
        let b = Tensor::zeros((2, 4), DType::F64, &Device::Cpu).unwrap();
        let v = Tensor::zeros(6, DType::F64, &Device::Cpu).unwrap();
        let g = GlobalBatch { tokens: 1.0, sequences: 1.0, horizon: 1.0 };
        let cfg = ObjectiveConfig::default();
        for batch in [
            PolicyBatch { logp: &a, old_logp: &b, advantages: &a, mask: &a, weights: None },
            PolicyBatch { logp: &a, old_logp: &a, advantages: &a, mask: &b, weights: None },
            PolicyBatch { logp: &v, old_logp: &v, advantages: &v, mask: &v, weights: None },
        ] {
            assert!(matches!(cfg.loss(&batch, 0.0, &g), Err(Error::Shape(_))));
            assert!(matches!(ratio_stats(&batch, &cfg), Err(Error::Shape(_))));
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct RunFile {
        objective: ObjectiveConfig,
    }

    #[test]
    fn serde_round_trips_json_and_toml() {
        let mut cfgs = all_kinds();
        cfgs.push(ObjectiveConfig {
            dual_clip: None,
            aggregation: Aggregation::SeqMeanTokenSumNorm,
            ..ObjectiveConfig::default()
        });
        for cfg in cfgs {
            let json = serde_json::to_string(&cfg).unwrap();
            assert_eq!(serde_json::from_str::<ObjectiveConfig>(&json).unwrap(), cfg, "{json}");
            let file = RunFile { objective: cfg.clone() };
            let text = toml::to_string(&file).unwrap();
            assert_eq!(toml::from_str::<RunFile>(&text).unwrap(), file, "{text}");
        }
        // Hand-written TOML: kebab-case names, partial tables fill in defaults.
        let text = "[objective]\nkind = \"kl-penalty\"\nkl_estimator = \"k2\"\ntopr_ratio_level = \"sequence\"\naggregation = \"seq-mean-token-mean\"\ndual_clip = \"none\"\n";
        let f: RunFile = toml::from_str(text).unwrap();
        let want = ObjectiveConfig {
            kind: ObjectiveKind::KlPenalty,
            kl_estimator: KlEstimator::K2,
            topr_ratio_level: RatioLevel::Sequence,
            aggregation: Aggregation::SeqMeanTokenMean,
            dual_clip: None,
            ..ObjectiveConfig::default()
        };
        assert_eq!(f.objective, want);
        assert_eq!(toml::from_str::<RunFile>("[objective]\n").unwrap().objective, ObjectiveConfig::default());
        assert_eq!(toml::from_str::<RunFile>("[objective]\ndual_clip = 10\n").unwrap().objective.dual_clip, Some(10.0));
        assert_eq!(toml::from_str::<RunFile>("[objective]\ndual_clip = false\n").unwrap().objective.dual_clip, None);
        assert_eq!(serde_json::from_str::<ObjectiveConfig>("{\"dual_clip\": null}").unwrap().dual_clip, None);
        assert!(toml::from_str::<RunFile>("[objective]\ndual_clip = \"yes\"\n").is_err());
        assert!(
            toml::from_str::<RunFile>("[objective]\nkind = \"ppo\"\n").is_err(),
            "kind names the loss, presets name configs"
        );
        assert!(toml::from_str::<RunFile>("[objective]\nclip_ratio = 0.2\n").is_err(), "unknown fields are rejected");
        for (kind, name) in [
            (ObjectiveKind::R2vpo, "\"r2vpo\""),
            (ObjectiveKind::IsPg, "\"is-pg\""),
            (ObjectiveKind::KlPenalty, "\"kl-penalty\""),
        ] {
            assert_eq!(serde_json::to_string(&kind).unwrap(), name);
        }
        let stats = RatioStats { tokens: 3.0, quantiles: vec![(0.5, 1.0)], ..RatioStats::default() };
        assert_eq!(serde_json::from_str::<RatioStats>(&serde_json::to_string(&stats).unwrap()).unwrap(), stats);
    }
}
