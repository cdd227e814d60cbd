//! Step counters and the per-update `metrics.jsonl` record.

use super::*;

/// Step counters, saved with checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    /// Updates done.
    pub update: u64,
    /// Environment steps done (all environments).
    pub env_steps: u64,
    /// Environment segment (see the module docs); the VecEnv seed derives from it.
    pub segment: u64,
    /// Episodes finished.
    pub episodes: u64,
    /// Evaluations done.
    pub evals: u64,
    /// Env-step count at which the next evaluation is due.
    pub next_eval: u64,
    /// Env-step count at which the next checkpoint is due.
    pub next_checkpoint: u64,
    /// Env-step count from which the next evaluation is filmed
    /// (`video.every`; absent from checkpoints written before videos).
    #[serde(default)]
    pub next_video: u64,
    /// Episodes reset on MuJoCo warnings (all segments).
    pub warning_resets: u64,
}

/// One `metrics.jsonl` record, written after every update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateMetrics {
    /// Update index (1-based).
    pub update: u64,
    /// Environment steps so far.
    pub env_steps: u64,
    /// Episodes finished during this update's rollout.
    pub episodes: usize,
    /// Mean undiscounted return of those episodes (unscaled rewards).
    pub episode_return_mean: Option<f64>,
    /// Their standard deviation.
    pub episode_return_std: Option<f64>,
    /// Mean ρ over the update's minibatches.
    pub ratio_mean: f64,
    /// Mean Var\[ρ\].
    pub ratio_var: f64,
    /// Mean E\[(ρ−1)²\].
    pub sq_dev: f64,
    /// max |ρ − 1| of the first minibatch of the first epoch (0 when the
    /// behaviour log-probs are exactly reproduced).
    pub first_minibatch_ratio_dev: f64,
    /// λ after the update.
    pub lambda: f64,
    /// Fraction of samples outside `[1−ε_low, 1+ε_high]`.
    pub clip_frac: f64,
    /// k1 estimate of KL(π_old‖π).
    pub approx_kl: f64,
    /// Mean policy entropy (nats): the unclipped Gaussian's, or the
    /// tanh-normal's sampled estimate.
    pub entropy: f64,
    /// Mean σ of the action distribution over the update's minibatch rows
    /// (absent in metrics written before it was logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigma_mean: Option<f64>,
    /// Mean policy loss (objective value, incl. R²VPO's penalty).
    pub policy_loss: f64,
    /// Mean value loss `½·mean((V − R)²)` (scaled rewards).
    pub value_loss: f64,
    /// Mean gradient norm before clipping.
    pub grad_norm: f64,
    /// 1 − Var\[R − V\]/Var\[R\] over the rollout.
    pub explained_variance: f64,
    /// Episodes reset on MuJoCo warnings so far.
    pub warning_resets: u64,
    /// Env steps per second of this update (rollout + learning).
    pub env_steps_per_s: f64,
    /// Seconds spent in the rollout.
    pub rollout_s: f64,
    /// Seconds spent learning.
    pub learn_s: f64,
    /// Mean evaluation return, when an evaluation ran: of the policy's mode
    /// or of sampled actions, as `eval_deterministic` says.
    pub eval_return_mean: Option<f64>,
    /// Its standard deviation.
    pub eval_return_std: Option<f64>,
    /// The video of this evaluation's first episode (`video.every`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub video: Option<String>,
}

impl UpdateMetrics {
    /// The record with wall-clock fields zeroed (for determinism checks).
    pub fn without_timing(&self) -> Self {
        Self { env_steps_per_s: 0.0, rollout_s: 0.0, learn_s: 0.0, ..self.clone() }
    }
}
