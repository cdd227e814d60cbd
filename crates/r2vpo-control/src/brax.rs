//! Brax's PPO loss, advantage estimate and observation normaliser: the
//! pieces of the control trainer's `brax` flavour that differ from CleanRL's
//! (`flavour = "brax"`, docs/control.md).
//!
//! Followed from Brax 0.14.2 (PyPI; `brax/training/agents/ppo/losses.py`,
//! `train.py`, `brax/training/acme/running_statistics.py`), read, not
//! translated: what Brax computes, per minibatch of `B` whole sequences of
//! `T` steps, is
//!
//! 1. the current networks on the minibatch's observations, normalised with
//!    the running statistics of the update ([`ObsNormalizer`]);
//! 2. values and advantages **recomputed with the current critic** for every
//!    minibatch ([`gae`]): `v_s` by GAE(λ) over the sequence, bootstrapped
//!    from the current critic at the sequence's next observation, then the
//!    advantage `r_t + γ(1 − term_t)·v_{s,t+1} − V(s_t)`; a truncated step has
//!    zero δ and zero advantage (Brax's `bootstrap_on_timeout = False`);
//! 3. advantages standardised over the minibatch;
//! 4. the policy objective on the log-probabilities, the value loss
//!    `½·vf·mean((v_s − V)²)`, and `−entropy_cost ×` the tanh-normal's
//!    sampled entropy estimate.
//!
//! The policy objective is the core crate's ([`Learner::loss`]): PPO's
//! clipped surrogate equals Brax's `−mean(min(ρÂ, clip(ρ, 1 ± ε)Â))`, and
//! R²VPO replaces it inside this same loss (Eq. primal_dual), so nothing
//! else differs between the two methods. `crates/r2vpo-control/tests/brax.rs`
//! checks every term and every gradient against Brax's own
//! `compute_ppo_loss` in JAX.

use candle_core::{DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use r2vpo::aggregate::GlobalBatch;
use r2vpo::learner::Learner;
use r2vpo::objective::{PolicyBatch, RatioStats};

use crate::error::{TrainError, TrainResult};
use crate::native::NativeNet;

/// Brax's running observation statistics
/// (`acme/running_statistics.py`, Welford mode, `std_eps = 0`): f32 mean
/// and summed variance, updated once per update with every observation of
/// the rollout **before** the SGD epochs, `std = clip(√(Σvar/count), 1e-6,
/// 1e6)`, and no clipping of the normalised values. Before the first update
/// it is the identity (mean 0, std 1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ObsNormalizer {
    /// Observations folded in.
    pub count: u64,
    /// Per-dimension mean.
    pub mean: Vec<f32>,
    /// Per-dimension sum of squared deviations.
    pub summed_variance: Vec<f32>,
    /// Per-dimension standard deviation the networks divide by.
    pub std: Vec<f32>,
}

impl ObsNormalizer {
    /// The identity over `dim` dimensions (Brax's `init_state`).
    pub fn new(dim: usize) -> Self {
        Self { count: 0, mean: vec![0.0; dim], summed_variance: vec![0.0; dim], std: vec![1.0; dim] }
    }

    /// Folds in a batch of row-major observations (`rows × dim`): Brax's
    /// batched Welford step. The sums over the batch run in f64 (Brax sums in
    /// f32 in whatever order XLA picks), so the result is the exactly
    /// rounded one.
    pub fn update(&mut self, batch: &[f32]) {
        let dim = self.mean.len();
        if dim == 0 || batch.is_empty() {
            return;
        }
        let rows = (batch.len() / dim) as u64;
        self.count += rows;
        // Brax converts its u64 count to f32 for the divisions.
        let count = self.count as f32;
        let mut dmean = vec![0f64; dim];
        for row in batch.chunks_exact(dim) {
            for ((d, &x), &m) in dmean.iter_mut().zip(row).zip(&self.mean) {
                *d += f64::from(x - m);
            }
        }
        let old = self.mean.clone();
        for (m, d) in self.mean.iter_mut().zip(&dmean) {
            *m += (*d / f64::from(count)) as f32;
        }
        let mut dvar = vec![0f64; dim];
        for row in batch.chunks_exact(dim) {
            for (((v, &x), &m0), &m1) in dvar.iter_mut().zip(row).zip(&old).zip(&self.mean) {
                *v += f64::from(x - m0) * f64::from(x - m1);
            }
        }
        for ((s, v), sd) in self.summed_variance.iter_mut().zip(&dvar).zip(self.std.iter_mut()) {
            *s += *v as f32;
            *sd = (s.max(0.0) / count).sqrt().clamp(1e-6, 1e6);
        }
    }

    /// `(mean, std)` as [`NativeNet::set_obs_norm`] takes them.
    pub fn mean_std(&self) -> (Vec<f32>, Vec<f32>) {
        (self.mean.clone(), self.std.clone())
    }
}

/// Brax's `compute_gae` over `B` sequences of `T` steps, time-major (step
/// `t` of sequence `b` at `t·B + b`): returns the value targets `v_s` and the
/// advantages, both `(T·B)`.
///
/// `δ_t = (r_t + γ(1 − term_t)·V_{t+1} − V_t)·(1 − trunc_t)` with `V_T` the
/// bootstrap; `v_s,t − V_t = δ_t + γ(1 − term_t)(1 − trunc_t)·λ·(v_s,t+1 −
/// V_{t+1})`; advantage `(r_t + γ(1 − term_t)·v_s,t+1 − V_t)·(1 − trunc_t)`
/// with `v_s,T` the bootstrap. The advantage is one-step on the λ-return
/// of the next state, not GAE's `Σ(γλ)ᵏδ`.
#[allow(clippy::too_many_arguments)]
pub fn gae(
    rewards: &[f32],
    values: &[f32],
    bootstrap: &[f32],
    truncation: &[bool],
    termination: &[bool],
    gamma: f32,
    lambda: f32,
    seqs: usize,
) -> (Vec<f32>, Vec<f32>) {
    let len = values.len();
    let steps = len / seqs.max(1);
    let next = |t: usize, b: usize, v: &[f32]| if t + 1 < steps { v[(t + 1) * seqs + b] } else { bootstrap[b] };
    let keep = |i: usize| if truncation[i] { 0f32 } else { 1.0 };
    let cont = |i: usize| if termination[i] { 0f32 } else { 1.0 };
    let mut vs = vec![0f32; len];
    for b in 0..seqs {
        let mut acc = 0f32;
        for t in (0..steps).rev() {
            let i = t * seqs + b;
            let delta = (rewards[i] + gamma * cont(i) * next(t, b, values) - values[i]) * keep(i);
            acc = delta + gamma * cont(i) * keep(i) * lambda * acc;
            vs[i] = acc + values[i];
        }
    }
    let mut adv = vec![0f32; len];
    for b in 0..seqs {
        for t in 0..steps {
            let i = t * seqs + b;
            adv[i] = (rewards[i] + gamma * cont(i) * next(t, b, &vs) - values[i]) * keep(i);
        }
    }
    (vs, adv)
}

/// The loss's settings (the trainer config's keys of the same meaning).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossConfig {
    /// γ (Brax's `discounting`).
    pub gamma: f64,
    /// GAE λ (`gae_lambda`).
    pub gae_lambda: f64,
    /// Weight of the entropy bonus (`entropy_cost`).
    pub entropy_cost: f64,
    /// Weight of the value loss (`vf_coefficient`): the loss is
    /// `½·value_coef·mean((v_s − V)²)`.
    pub value_coef: f64,
    /// Standardise the advantages over the minibatch.
    pub normalize_advantage: bool,
}

/// One minibatch of `seqs` whole sequences of `unroll` steps, time-major
/// (step `t` of sequence `b` at row `t·seqs + b`).
#[derive(Clone, Copy, Debug)]
pub struct Minibatch<'a> {
    /// Steps per sequence (`T`).
    pub unroll: usize,
    /// Sequences (`B`).
    pub seqs: usize,
    /// Observations as the environment gave them, `(T·B, obs_dim)`.
    pub obs: &'a [f32],
    /// The observation after each sequence's last step, `(B, obs_dim)`.
    pub bootstrap_obs: &'a [f32],
    /// The stored (for the tanh-normal: pre-tanh) actions, `(T·B, A)`.
    pub actions: &'a [f32],
    /// The behaviour policy's log-probabilities of `actions`, `(T·B)`.
    pub behaviour_logp: &'a [f32],
    /// Rewards, already scaled, `(T·B)`.
    pub rewards: &'a [f32],
    /// The episode was cut by its time limit at this step.
    pub truncation: &'a [bool],
    /// The episode ended in a terminal state at this step.
    pub termination: &'a [bool],
    /// Standard-normal draws `(T·B, A)` for the tanh-normal's entropy
    /// estimate (ignored by the normal distribution).
    pub entropy_noise: &'a [f32],
}

/// The loss's value and terms (Brax's metric names where it has one).
#[derive(Clone, Debug)]
pub struct LossTerms {
    /// `policy_loss + v_loss + entropy_loss`.
    pub total: f64,
    /// The policy objective (PPO's clipped surrogate or R²VPO's).
    pub policy_loss: f64,
    /// `½·value_coef·mean((v_s − V)²)`.
    pub v_loss: f64,
    /// `−entropy_cost · entropy`.
    pub entropy_loss: f64,
    /// Mean entropy (estimate) per row.
    pub entropy: f64,
    /// `½·mean((v_s − V)²)`, the trainer's logged value loss.
    pub value_loss: f64,
    /// Mean σ of the action distribution over the minibatch.
    pub sigma_mean: f64,
    /// `1 − Var(v_s − V)/Var(v_s)` over the minibatch.
    pub explained_variance: f64,
    /// The objective's ratio statistics.
    pub stats: RatioStats,
}

/// Brax's PPO loss on one minibatch, with the core's objective as its
/// policy term; adds every parameter's gradient to `grads` (in
/// [`NativeNet::params`] order). See the module docs for the terms.
pub fn loss_and_grads(
    net: &NativeNet,
    learner: &Learner,
    mb: &Minibatch,
    cfg: &LossConfig,
    grads: &mut [Vec<f32>],
) -> TrainResult<LossTerms> {
    let (t_len, b) = (mb.unroll, mb.seqs);
    let rows = t_len * b;
    let a = net.act_dim();
    if mb.behaviour_logp.len() != rows || mb.actions.len() != rows * a || mb.entropy_noise.len() != rows * a {
        return Err(TrainError::Config {
            field: "minibatch".into(),
            message: format!("a minibatch of {b} sequences × {t_len} steps has inconsistent lengths"),
        });
    }
    let mut f = net.forward(mb.obs, rows);
    f.set_entropy_noise(mb.entropy_noise.to_vec());
    let bootstrap = net.value(mb.bootstrap_obs, b);
    let (vs, mut adv) = gae(
        mb.rewards,
        &f.value,
        &bootstrap,
        mb.truncation,
        mb.termination,
        cfg.gamma as f32,
        cfg.gae_lambda as f32,
        b,
    );
    if cfg.normalize_advantage {
        let v: Vec<f64> = adv.iter().map(|&x| f64::from(x)).collect();
        let (m, s) = r2vpo::stats::mean_std(&v);
        for (x, y) in adv.iter_mut().zip(v) {
            *x = ((y - m) / (s + 1e-8)) as f32;
        }
    }
    let dev = &Device::Cpu;
    let mask = Tensor::ones((rows, 1), DType::F32, dev)?;
    let global = GlobalBatch::from_mask(&mask)?;
    let old = Tensor::from_slice(mb.behaviour_logp, (rows, 1), dev)?;
    let adv_t = Tensor::from_slice(&adv, (rows, 1), dev)?;
    let logp = Var::from_vec(net.log_prob(&f, mb.actions), (rows, 1), dev)?;
    let out = learner.loss(
        &PolicyBatch { logp: logp.as_tensor(), old_logp: &old, advantages: &adv_t, mask: &mask, weights: None },
        &global,
    )?;
    let dlogp = match out.loss.backward()?.get(logp.as_tensor()) {
        Some(g) => g.flatten_all()?.to_vec1::<f32>()?,
        None => vec![0f32; rows],
    };
    let sq: f64 = f.value.iter().zip(&vs).map(|(&v, &r)| f64::from(r - v).powi(2)).sum::<f64>();
    let value_loss = 0.5 * sq / rows as f64;
    let v_loss = cfg.value_coef * value_loss;
    let entropy = f64::from(net.entropy(&f));
    let entropy_loss = -cfg.entropy_cost * entropy;
    let policy_loss = out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    let vc = cfg.value_coef as f32;
    let dvalue: Vec<f32> = f.value.iter().zip(&vs).map(|(&v, &r)| vc * (v - r) / rows as f32).collect();
    net.backward(&f, mb.actions, &dlogp, &dvalue, -(cfg.entropy_cost as f32), grads);
    let explained_variance = {
        let t: Vec<f64> = vs.iter().map(|&x| f64::from(x)).collect();
        let e: Vec<f64> = vs.iter().zip(&f.value).map(|(&r, &v)| f64::from(r - v)).collect();
        let ((_, st), (_, se)) = (r2vpo::stats::mean_std(&t), r2vpo::stats::mean_std(&e));
        if st > 0.0 {
            1.0 - (se * se) / (st * st)
        } else {
            0.0
        }
    };
    Ok(LossTerms {
        total: policy_loss + v_loss + entropy_loss,
        policy_loss,
        v_loss,
        entropy_loss,
        entropy,
        value_loss,
        sigma_mean: net.mean_sigma(&f),
        explained_variance,
        stats: out.stats,
    })
}
