//! The on-policy actor-critic trainer shared by PPO and R²VPO.
//!
//! One update (Brax's schedule): roll out `T = batch_size·minibatches·unroll
//! / num_envs` steps of every environment, compute GAE over the `T × N`
//! rollout (truncation bootstraps from the pre-reset `final_obs`, MuJoCo
//! instability is terminal), then `epochs` passes of `minibatches` shuffled
//! minibatches of `batch_size·unroll` transitions. The policy loss is the
//! core crate's [`ObjectiveConfig::loss`]; value loss, entropy bonus,
//! global gradient-norm clipping and Adam are identical for every objective,
//! so a PPO and an R²VPO run differ in `[objective]` only.
//!
//! **Checkpoints are environment-segment boundaries.** MuJoCo state and the
//! environments' private RNGs are not saved; instead, at every checkpoint
//! the trainer rebuilds its [`VecEnv`] from a seed derived from `(seed,
//! segment)`, in an uninterrupted run just as in a resumed one. Episodes in
//! flight are cut there (the rollout that ends at the checkpoint bootstraps
//! from its last value, as at any rollout end), so a resumed run repeats the
//! uninterrupted one exactly. Choose `checkpoint_every` as a multiple of
//! `1000·num_envs` steps (the episode length) and nothing is cut.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use r2vpo::advantage::{gae, GaeConfig};
use r2vpo::aggregate::GlobalBatch;
use r2vpo::dual::{DualConfig, DualVariable};
use r2vpo::objective::{ObjectiveConfig, ObjectiveKind, PolicyBatch, RatioStats};
use r2vpo_report::{atomic_write, atomic_write_json, ReportError};

use crate::native::NativeNet;
use crate::policy::{ActorCritic, PolicyConfig};
use crate::vec_env::{EpisodeStats, RunningMeanStd, VecEnv, VecEnvConfig};

/// Errors of training, evaluation and checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The environment layer failed.
    #[error(transparent)]
    Env(#[from] crate::Error),
    /// A tensor operation failed.
    #[error("tensor error: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The algorithm core rejected an input.
    #[error(transparent)]
    Core(#[from] r2vpo::Error),
    /// Writing a report file failed.
    #[error(transparent)]
    Report(#[from] ReportError),
    /// Reading or parsing a file failed.
    #[error("{}: {message}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// A configuration value is out of range.
    #[error("invalid `{field}`: {message}")]
    Config {
        /// Dotted name of the field.
        field: String,
        /// Why it is invalid.
        message: String,
    },
    /// A loss or gradient became non-finite.
    #[error("training diverged at update {update}: {what}")]
    Diverged {
        /// The update index.
        update: u64,
        /// The non-finite quantity.
        what: String,
    },
}

/// Result alias of the trainer.
pub type TrainResult<T> = std::result::Result<T, TrainError>;

fn config_err(field: &str, message: String) -> TrainError {
    TrainError::Config { field: field.into(), message }
}

/// A full control training run (the `r2vpo control train` config). The
/// defaults are the CPU configuration (`configs/control/cpu.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// Registry task name, e.g. `cheetah-run`.
    pub task: String,
    /// Master seed (networks, sampling, environments).
    pub seed: u64,
    /// Training budget in environment steps (summed over environments).
    pub total_env_steps: u64,
    /// Parallel environments.
    pub num_envs: usize,
    /// Length of the trajectory segments minibatches are made of (Brax's
    /// `unroll_length`).
    pub unroll: usize,
    /// Segments per minibatch (Brax's `batch_size`): a minibatch holds
    /// `batch_size × unroll` transitions.
    pub batch_size: usize,
    /// Minibatches per epoch.
    pub minibatches: usize,
    /// Passes over each rollout.
    pub epochs: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Adam β₁.
    pub adam_beta1: f64,
    /// Adam β₂.
    pub adam_beta2: f64,
    /// Adam ε.
    pub adam_eps: f64,
    /// Global gradient-norm clip; 0 disables it.
    pub max_grad_norm: f64,
    /// Coefficient of the entropy bonus.
    pub entropy_cost: f64,
    /// Coefficient of the value loss `½·mean((V − R)²)`.
    pub value_coef: f64,
    /// Standardise advantages within each minibatch.
    pub normalize_advantage: bool,
    /// Rewards are multiplied by this for learning (returns are logged unscaled).
    pub reward_scale: f64,
    /// Running observation normalisation.
    pub normalize_obs: bool,
    /// Normalised observations are clipped to ±this.
    pub obs_clip: f64,
    /// γ and λ of GAE.
    pub gae: GaeConfig,
    /// The policy objective: `kind = "clip"` (PPO) or `"r2vpo"`.
    pub objective: ObjectiveConfig,
    /// λ of R²VPO (fixed 0.06 for control).
    pub dual: DualConfig,
    /// Network shapes and action distribution.
    pub policy: PolicyConfig,
    /// Evaluate every this many env steps (0: only at the end).
    pub eval_every: u64,
    /// Episodes per evaluation (0 disables evaluation).
    pub eval_episodes: usize,
    /// Checkpoint every this many env steps (0: only at the end).
    pub checkpoint_every: u64,
    /// DM Control suite folder override.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suite_dir: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            task: "cheetah-run".into(),
            seed: 0,
            total_env_steps: 1_000_000,
            num_envs: 32,
            unroll: 32,
            batch_size: 4,
            minibatches: 32,
            epochs: 10,
            lr: 3e-4,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            adam_eps: 1e-8,
            max_grad_norm: 0.5,
            entropy_cost: 0.0,
            value_coef: 0.5,
            normalize_advantage: true,
            reward_scale: 1.0,
            normalize_obs: true,
            obs_clip: 10.0,
            gae: GaeConfig { gamma: 0.99, lambda: 0.95 },
            objective: ObjectiveConfig::default(),
            dual: DualConfig::control_default(),
            policy: PolicyConfig::default(),
            eval_every: 100_000,
            eval_episodes: 10,
            checkpoint_every: 0,
            suite_dir: None,
        }
    }
}

impl TrainConfig {
    /// Environment steps per environment in one rollout.
    pub fn rollout_len(&self) -> usize {
        self.batch_size * self.minibatches * self.unroll / self.num_envs.max(1)
    }

    /// Environment steps (all environments) per update.
    pub fn steps_per_update(&self) -> u64 {
        (self.rollout_len() * self.num_envs) as u64
    }

    /// Transitions per minibatch.
    pub fn minibatch_size(&self) -> usize {
        self.batch_size * self.unroll
    }

    /// Checks every field; errors name the field.
    pub fn validate(&self) -> TrainResult<()> {
        for (k, v) in [
            ("num_envs", self.num_envs),
            ("unroll", self.unroll),
            ("batch_size", self.batch_size),
            ("minibatches", self.minibatches),
            ("epochs", self.epochs),
        ] {
            if v == 0 {
                return Err(config_err(k, "must be at least 1".into()));
            }
        }
        let segments = self.batch_size * self.minibatches;
        if segments % self.num_envs != 0 {
            return Err(config_err(
                "batch_size",
                format!(
                    "batch_size × minibatches = {segments} segments per update must be a multiple of num_envs = {}",
                    self.num_envs
                ),
            ));
        }
        for (k, v) in [
            ("lr", self.lr),
            ("adam_eps", self.adam_eps),
            ("reward_scale", self.reward_scale),
            ("obs_clip", self.obs_clip),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(config_err(k, format!("must be finite and > 0, got {v}")));
            }
        }
        for (k, v) in [("adam_beta1", self.adam_beta1), ("adam_beta2", self.adam_beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(config_err(k, format!("must lie in [0, 1), got {v}")));
            }
        }
        for (k, v) in [
            ("max_grad_norm", self.max_grad_norm),
            ("entropy_cost", self.entropy_cost),
            ("value_coef", self.value_coef),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(config_err(k, format!("must be finite and >= 0, got {v}")));
            }
        }
        if self.total_env_steps == 0 {
            return Err(config_err("total_env_steps", "must be at least 1".into()));
        }
        self.gae.validate()?;
        self.objective.validate()?;
        self.dual.validate()?;
        self.policy.validate()?;
        crate::tasks::task_spec(&self.task)?;
        Ok(())
    }

    fn env_config(&self, num_envs: usize, seed: u64) -> VecEnvConfig {
        VecEnvConfig {
            task: self.task.clone(),
            num_envs,
            seed,
            normalize_obs: self.normalize_obs,
            obs_clip: self.obs_clip,
            reward_scale: self.reward_scale,
            suite_dir: self.suite_dir.clone(),
        }
    }
}

/// Named algorithms as `--set`-style overrides: `ppo` (clip 0.2, no
/// dual-clip, as in standard PPO) and `r2vpo`.
pub fn algo_overrides(name: &str) -> TrainResult<Vec<String>> {
    let v: &[&str] = match name {
        "ppo" => &["objective.kind=clip", "objective.dual_clip=\"none\""],
        "r2vpo" => &["objective.kind=r2vpo"],
        other => return Err(config_err("algo", format!("unknown algorithm `{other}`; one of: ppo, r2vpo"))),
    };
    Ok(v.iter().map(|s| s.to_string()).collect())
}

/// SplitMix64: derives independent seeds from the master seed.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn derived_seed(seed: u64, tag: u64, index: u64) -> u64 {
    mix(mix(seed ^ mix(tag)) ^ index)
}

const TAG_INIT: u64 = 1;
const TAG_SAMPLING: u64 = 2;
const TAG_ENV: u64 = 3;
const TAG_EVAL: u64 = 4;

/// Adam (Kingma & Ba) on flat f32 buffers, with moments that can be
/// checkpointed (candle_nn's `AdamW` keeps them private).
#[derive(Debug, Clone)]
pub struct Adam {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    t: u64,
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl Adam {
    /// Zero moments for `params`.
    pub fn new(params: &[(String, Var)], lr: f64, beta1: f64, beta2: f64, eps: f64) -> Self {
        let zeros = || params.iter().map(|(_, p)| vec![0f32; p.elem_count()]).collect();
        Self { lr, beta1, beta2, eps, t: 0, m: zeros(), v: zeros() }
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// One step: gradients are scaled by `min(1, max_norm / ‖g‖)` when
    /// `max_norm > 0` (‖g‖ over all parameters together). Returns ‖g‖ before
    /// clipping. Parameters without a gradient get a zero gradient.
    pub fn step(&mut self, params: &[(String, Var)], grads: &GradStore, max_norm: f64) -> TrainResult<f64> {
        let mut gs = Vec::with_capacity(params.len());
        let mut ws = Vec::with_capacity(params.len());
        for (_, p) in params {
            gs.push(match grads.get(p.as_tensor()) {
                Some(g) => g.flatten_all()?.to_vec1::<f32>()?,
                None => vec![0f32; p.elem_count()],
            });
            ws.push(p.as_tensor().flatten_all()?.to_vec1::<f32>()?);
        }
        let norm = self.step_flat(&mut ws.iter_mut().collect::<Vec<_>>(), &gs, max_norm);
        for ((_, p), w) in params.iter().zip(ws) {
            p.set(&Tensor::from_vec(w, p.shape(), &Device::Cpu)?)?;
        }
        Ok(norm)
    }

    /// [`Adam::step`] on flat buffers: `params[i]` and `grads[i]` pair with
    /// the `i`-th parameter given to [`Adam::new`]. Returns ‖g‖ before
    /// clipping; a non-finite norm leaves everything untouched.
    pub fn step_flat(&mut self, params: &mut [&mut Vec<f32>], grads: &[Vec<f32>], max_norm: f64) -> f64 {
        let sq: f64 = grads.iter().flatten().map(|&x| f64::from(x) * f64::from(x)).sum();
        let norm = sq.sqrt();
        if !norm.is_finite() {
            return norm;
        }
        let scale = if max_norm > 0.0 && norm > max_norm { max_norm / (norm + 1e-6) } else { 1.0 };
        self.t += 1;
        let t = self.t as i32;
        let c1 = 1.0 - self.beta1.powi(t);
        let c2 = 1.0 - self.beta2.powi(t);
        let step = (self.lr / c1) as f32;
        let c2s = c2.sqrt() as f32;
        let (b1, b2, eps) = (self.beta1 as f32, self.beta2 as f32, self.eps as f32);
        let scale = scale as f32;
        for ((w, g), (m, v)) in params.iter_mut().zip(grads).zip(self.m.iter_mut().zip(self.v.iter_mut())) {
            // Zipped iterators (no indexing) so the loop vectorises.
            for (((w, &g), m), v) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                let gi = g * scale;
                *m = b1 * *m + (1.0 - b1) * gi;
                *v = b2 * *v + (1.0 - b2) * gi * gi;
                // lr·m̂/(√v̂ + ε) with m̂ = m/c1, v̂ = v/c2.
                *w -= step * *m / (v.sqrt() / c2s + eps);
            }
        }
        norm
    }
}

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
    /// Mean policy entropy (nats, of the unclipped Gaussian).
    pub entropy: f64,
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
    /// Mean deterministic evaluation return, when an evaluation ran.
    pub eval_return_mean: Option<f64>,
    /// Its standard deviation.
    pub eval_return_std: Option<f64>,
}

impl UpdateMetrics {
    /// The record with wall-clock fields zeroed (for determinism checks).
    pub fn without_timing(&self) -> Self {
        Self { env_steps_per_s: 0.0, rollout_s: 0.0, learn_s: 0.0, ..self.clone() }
    }
}

fn mean_std(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n).sqrt())
}

/// The JSON half of a checkpoint (weights and Adam moments are in the
/// `.safetensors` file it names).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointState {
    /// Format version.
    pub format: u32,
    /// The run's resolved config.
    pub config: TrainConfig,
    /// Step counters.
    pub counters: Counters,
    /// Action-sampling and shuffling RNG.
    pub rng: ChaCha8Rng,
    /// Observation normalisation statistics.
    pub obs_stats: RunningMeanStd,
    /// λ and its settings.
    pub dual: DualVariable,
    /// Adam's step count.
    pub adam_steps: u64,
    /// File name (in the same folder) of the weights and Adam moments.
    pub weights: String,
}

const CHECKPOINT_FORMAT: u32 = 1;

/// Reusable rollout buffers (time-major: step `t` of env `n` at `t·N + n`).
#[derive(Debug, Default)]
struct Rollout {
    obs: Vec<f32>,
    actions: Vec<f32>,
    logp: Vec<f32>,
    values: Vec<f32>,
    rewards: Vec<f32>,
    truncated: Vec<bool>,
    terminated: Vec<bool>,
    /// V(final_obs) at truncated steps.
    final_values: Vec<f32>,
}

/// PPO / R²VPO on one task.
#[derive(Debug)]
pub struct Trainer {
    cfg: TrainConfig,
    env: VecEnv,
    net: ActorCritic,
    /// The working copy every rollout and gradient step uses; written back
    /// into `net` after each update (see [`crate::native`]).
    fast: NativeNet,
    params: Vec<(String, Var)>,
    adam: Adam,
    dual: DualVariable,
    rng: ChaCha8Rng,
    obs: Vec<f32>,
    counters: Counters,
    buf: Rollout,
    /// Observation statistics at the start of the current segment, before
    /// its reset observations were folded in: what a checkpoint saves, so
    /// that the resumed segment's reset folds them in exactly once.
    segment_stats: RunningMeanStd,
}

impl Trainer {
    /// A fresh run.
    pub fn new(cfg: TrainConfig) -> TrainResult<Self> {
        cfg.validate()?;
        let env = VecEnv::new(cfg.env_config(cfg.num_envs, derived_seed(cfg.seed, TAG_ENV, 0)))?;
        let net = ActorCritic::new(
            &cfg.policy,
            env.observation_dim(),
            env.action_dim(),
            derived_seed(cfg.seed, TAG_INIT, 0),
        )?;
        let params = net.named_params();
        let fast = NativeNet::from_net(&net)?;
        let adam = Adam::new(&params, cfg.lr, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps);
        let dual = DualVariable::new(&cfg.dual)?;
        let rng = ChaCha8Rng::seed_from_u64(derived_seed(cfg.seed, TAG_SAMPLING, 0));
        let counters =
            Counters { next_eval: cfg.eval_every, next_checkpoint: cfg.checkpoint_every, ..Counters::default() };
        let segment_stats = env.obs_stats().clone();
        let mut t = Self {
            cfg,
            env,
            net,
            fast,
            params,
            adam,
            dual,
            rng,
            obs: Vec::new(),
            counters,
            buf: Rollout::default(),
            segment_stats,
        };
        t.reset_envs()?;
        Ok(t)
    }

    /// The configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The networks.
    pub fn net(&self) -> &ActorCritic {
        &self.net
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Current observation statistics.
    pub fn obs_stats(&self) -> &RunningMeanStd {
        self.env.obs_stats()
    }

    /// The current λ.
    pub fn lambda(&self) -> f64 {
        self.dual.value()
    }

    /// Whether the budget is spent.
    pub fn done(&self) -> bool {
        self.counters.env_steps >= self.cfg.total_env_steps
    }

    fn reset_envs(&mut self) -> TrainResult<()> {
        let obs = self.env.reset()?;
        self.obs = obs.iter().map(|&x| x as f32).collect();
        Ok(())
    }

    /// Starts a new environment segment: a fresh [`VecEnv`] seeded from
    /// `(seed, segment)`, carrying the observation statistics over.
    fn new_segment(&mut self, segment: u64) -> TrainResult<()> {
        let stats = self.env.obs_stats().clone();
        let mut env =
            VecEnv::new(self.cfg.env_config(self.cfg.num_envs, derived_seed(self.cfg.seed, TAG_ENV, segment)))?;
        env.set_obs_stats(stats.clone())?;
        self.segment_stats = stats;
        self.env = env;
        self.counters.segment = segment;
        self.reset_envs()
    }

    /// Collects one rollout into the buffers; returns the finished episodes.
    fn rollout(&mut self) -> TrainResult<Vec<EpisodeStats>> {
        let (n, d, a) = (self.cfg.num_envs, self.net.obs_dim(), self.net.act_dim());
        let t_len = self.cfg.rollout_len();
        let b = &mut self.buf;
        b.obs.clear();
        b.actions.clear();
        b.logp.clear();
        b.values.clear();
        b.rewards.clear();
        b.truncated.clear();
        b.terminated.clear();
        b.final_values.clear();
        b.final_values.resize(t_len * n, 0.0);
        let mut episodes = Vec::new();
        let mut actions = vec![0f32; n * a];
        let mut env_actions = vec![0f64; n * a];
        let mut final_rows: Vec<usize> = Vec::new();
        let mut final_obs: Vec<f32> = Vec::new();
        for t in 0..t_len {
            let f = self.fast.infer(&self.obs, n);
            let per_row = f.log_std.len() == n * a;
            for (i, (act, env_act)) in actions.iter_mut().zip(env_actions.iter_mut()).enumerate() {
                let ls = if per_row { f.log_std[i] } else { f.log_std[i % a] };
                let eps: f32 = StandardNormal.sample(&mut self.rng);
                *act = f.mean[i] + ls.exp() * eps;
                *env_act = f64::from(*act).clamp(-1.0, 1.0);
            }
            // The learner recomputes log π with this same function, so the
            // first minibatch's ratios are exactly 1.
            let logp = self.fast.log_prob(&f, &actions);
            let b = &mut self.buf;
            b.obs.extend_from_slice(&self.obs);
            b.actions.extend_from_slice(&actions);
            b.logp.extend_from_slice(&logp);
            b.values.extend_from_slice(&f.value);

            let step = self.env.step(&env_actions)?;
            b.rewards.extend(step.rewards.iter().map(|&r| r as f32));
            b.truncated.extend_from_slice(&step.truncated);
            b.terminated.extend_from_slice(&step.unstable);
            final_rows.clear();
            final_obs.clear();
            for (i, &tr) in step.truncated.iter().enumerate() {
                if tr {
                    final_rows.push(i);
                    final_obs.extend(step.final_obs[i * d..(i + 1) * d].iter().map(|&x| x as f32));
                }
            }
            for (o, &x) in self.obs.iter_mut().zip(&step.obs) {
                *o = x as f32;
            }
            if !final_rows.is_empty() {
                let fv = self.fast.value(&final_obs, final_rows.len());
                for (&i, v) in final_rows.iter().zip(fv) {
                    self.buf.final_values[t * n + i] = v;
                }
            }
            episodes.extend(self.env.drain_finished());
        }
        Ok(episodes)
    }

    /// `next_values` for GAE: V of the next step's observation, V(final_obs)
    /// where the episode was truncated, and the bootstrap V(s_T) at the end.
    fn next_values(&self) -> TrainResult<Vec<f32>> {
        let n = self.cfg.num_envs;
        let b = &self.buf;
        let len = b.values.len();
        let bootstrap = self.fast.value(&self.obs, n);
        let mut next = Vec::with_capacity(len);
        next.extend_from_slice(&b.values[n..]);
        next.extend_from_slice(&bootstrap);
        for ((nv, &tr), &fv) in next.iter_mut().zip(&b.truncated).zip(&b.final_values) {
            if tr {
                *nv = fv;
            }
        }
        Ok(next)
    }

    /// One update: rollout, GAE, epochs × minibatches. Does not evaluate or
    /// checkpoint (see [`Trainer::run`]).
    pub fn update(&mut self) -> TrainResult<UpdateMetrics> {
        let t0 = Instant::now();
        let episodes = self.rollout()?;
        let rollout_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let (n, d, a) = (self.cfg.num_envs, self.net.obs_dim(), self.net.act_dim());
        let next_values = self.next_values()?;
        let b = &self.buf;
        let (adv, ret) = gae(&b.rewards, &b.values, &next_values, &b.terminated, &b.truncated, n, &self.cfg.gae)?;
        let total = b.values.len();
        let explained_variance = {
            let (_, sr) = mean_std(&ret.iter().map(|&x| f64::from(x)).collect::<Vec<_>>());
            let resid: Vec<f64> = ret.iter().zip(&b.values).map(|(&r, &v)| f64::from(r - v)).collect();
            let (_, se) = mean_std(&resid);
            if sr > 0.0 {
                1.0 - (se * se) / (sr * sr)
            } else {
                0.0
            }
        };

        let mb = self.cfg.minibatch_size();
        let mut order: Vec<usize> = (0..total).collect();
        let mut stats: Vec<RatioStats> = Vec::new();
        let (mut ent_sum, mut vl_sum, mut gn_sum, mut pl_sum) = (0.0, 0.0, 0.0, 0.0);
        let mut first_dev = 0.0;
        let mut steps = 0usize;
        let (mut o_mb, mut a_mb, mut lp_mb, mut adv_mb, mut ret_mb) = (
            Vec::with_capacity(mb * d),
            Vec::with_capacity(mb * a),
            Vec::with_capacity(mb),
            Vec::with_capacity(mb),
            Vec::with_capacity(mb),
        );
        let mask = Tensor::ones((mb, 1), DType::F32, &Device::Cpu)?;
        let global = GlobalBatch::from_mask(&mask)?;
        let update_index = self.counters.update + 1;
        // One gradient buffer per update, zeroed before each step.
        let mut grads = self.fast.zero_grads();
        for epoch in 0..self.cfg.epochs {
            for i in 0..total {
                let j = self.rng.random_range(i..total);
                order.swap(i, j);
            }
            for (k, idx) in order.chunks_exact(mb).enumerate() {
                let b = &self.buf;
                o_mb.clear();
                a_mb.clear();
                lp_mb.clear();
                adv_mb.clear();
                ret_mb.clear();
                for &i in idx {
                    o_mb.extend_from_slice(&b.obs[i * d..(i + 1) * d]);
                    a_mb.extend_from_slice(&b.actions[i * a..(i + 1) * a]);
                    lp_mb.push(b.logp[i]);
                    adv_mb.push(adv[i]);
                    ret_mb.push(ret[i]);
                }
                if self.cfg.normalize_advantage {
                    let v: Vec<f64> = adv_mb.iter().map(|&x| f64::from(x)).collect();
                    let (m, s) = mean_std(&v);
                    for (x, y) in adv_mb.iter_mut().zip(v) {
                        *x = ((y - m) / (s + 1e-8)) as f32;
                    }
                }
                let dev = &Device::Cpu;
                let old_t = Tensor::from_slice(&lp_mb, (mb, 1), dev)?;
                let adv_t = Tensor::from_slice(&adv_mb, (mb, 1), dev)?;
                let f = self.fast.forward(&o_mb, mb);
                // The policy objective (the paper's equations) runs in the
                // core crate on the log-probs alone; its gradient there is
                // the seed of the hand-written backward pass.
                let logp = Var::from_vec(self.fast.log_prob(&f, &a_mb), (mb, 1), dev)?;
                let out = self.cfg.objective.loss(
                    &PolicyBatch { logp: logp.as_tensor(), old_logp: &old_t, advantages: &adv_t, mask: &mask },
                    self.dual.value(),
                    &global,
                )?;
                let dlogp = match out.loss.backward()?.get(logp.as_tensor()) {
                    Some(g) => g.flatten_all()?.to_vec1::<f32>()?,
                    None => vec![0f32; mb],
                };
                // ½·mean (V − R)² and the mean Gaussian entropy, by hand.
                let value_loss =
                    f.value.iter().zip(&ret_mb).map(|(&v, &r)| f64::from(v - r).powi(2)).sum::<f64>() * 0.5 / mb as f64;
                let entropy = f64::from(self.fast.entropy(&f));
                let vc = self.cfg.value_coef as f32;
                let dvalue: Vec<f32> = f.value.iter().zip(&ret_mb).map(|(&v, &r)| vc * (v - r) / mb as f32).collect();
                let loss_v = out.loss.to_dtype(DType::F64)?.to_scalar::<f64>()? + self.cfg.value_coef * value_loss
                    - self.cfg.entropy_cost * entropy;
                if !loss_v.is_finite() {
                    return Err(TrainError::Diverged { update: update_index, what: format!("loss = {loss_v}") });
                }
                grads.iter_mut().for_each(|g| g.fill(0.0));
                self.fast.backward(&f, &a_mb, &dlogp, &dvalue, -(self.cfg.entropy_cost as f32), &mut grads);
                let gn = self.adam.step_flat(&mut self.fast.params_mut(), &grads, self.cfg.max_grad_norm);
                if !gn.is_finite() {
                    return Err(TrainError::Diverged { update: update_index, what: format!("gradient norm = {gn}") });
                }
                if matches!(self.cfg.objective.kind, ObjectiveKind::R2vpo | ObjectiveKind::KlPenalty) {
                    self.dual.update(out.stats.constraint)?;
                }
                if epoch == 0 && k == 0 {
                    first_dev = (out.stats.ratio_max - 1.0).abs().max((out.stats.ratio_min - 1.0).abs());
                }
                ent_sum += entropy;
                vl_sum += value_loss;
                pl_sum += out.stats.pg_loss + out.stats.penalty;
                gn_sum += gn;
                stats.push(out.stats);
                steps += 1;
            }
        }
        self.fast.write_to(&self.net)?;
        let learn_s = t1.elapsed().as_secs_f64();
        let s = RatioStats::merge(&stats);
        let k = steps.max(1) as f64;
        let new_steps = (total) as u64;
        self.counters.update = update_index;
        self.counters.env_steps += new_steps;
        self.counters.episodes += episodes.len() as u64;
        let warn = episodes.iter().filter(|e| e.unstable).count() as u64;
        self.counters.warning_resets += warn;
        let full: Vec<f64> = episodes.iter().filter(|e| !e.unstable).map(|e| e.ret).collect();
        let (rm, rs) = mean_std(&full);
        Ok(UpdateMetrics {
            update: update_index,
            env_steps: self.counters.env_steps,
            episodes: full.len(),
            episode_return_mean: (!full.is_empty()).then_some(rm),
            episode_return_std: (!full.is_empty()).then_some(rs),
            ratio_mean: s.ratio_mean,
            ratio_var: s.ratio_var,
            sq_dev: s.sq_dev_mean,
            first_minibatch_ratio_dev: first_dev,
            lambda: self.dual.value(),
            clip_frac: s.clip_frac_low + s.clip_frac_high,
            approx_kl: s.approx_kl,
            entropy: ent_sum / k,
            policy_loss: pl_sum / k,
            value_loss: vl_sum / k,
            grad_norm: gn_sum / k,
            explained_variance,
            warning_resets: self.counters.warning_resets,
            env_steps_per_s: new_steps as f64 / (rollout_s + learn_s).max(1e-9),
            rollout_s,
            learn_s,
            eval_return_mean: None,
            eval_return_std: None,
        })
    }

    /// Deterministic evaluation (mean action, clipped) over `episodes`
    /// complete episodes of fresh environments seeded from `(seed, index)`,
    /// with the training observation statistics frozen. Returns the
    /// undiscounted returns.
    pub fn evaluate(&self, episodes: usize, index: u64) -> TrainResult<Vec<f64>> {
        evaluate_policy(
            &self.cfg,
            &self.net,
            self.env.obs_stats(),
            episodes,
            derived_seed(self.cfg.seed, TAG_EVAL, index),
        )
    }

    /// Trains until the budget is spent, evaluating and checkpointing on
    /// schedule; every update's metrics go to `metrics` (if given) and to
    /// `on_update`. Checkpoints go to `checkpoint_dir` (if given).
    pub fn run(
        &mut self,
        checkpoint_dir: Option<&Path>,
        mut metrics: Option<&mut r2vpo_report::JsonlWriter>,
        mut on_update: impl FnMut(&UpdateMetrics),
    ) -> TrainResult<Vec<UpdateMetrics>> {
        let mut all = Vec::new();
        while !self.done() {
            let mut m = self.update()?;
            let finished = self.done();
            if self.cfg.eval_episodes > 0
                && (finished || (self.cfg.eval_every > 0 && self.counters.env_steps >= self.counters.next_eval))
            {
                let r = self.evaluate(self.cfg.eval_episodes, self.counters.evals)?;
                self.counters.evals += 1;
                while self.cfg.eval_every > 0 && self.counters.next_eval <= self.counters.env_steps {
                    self.counters.next_eval += self.cfg.eval_every;
                }
                let (em, es) = mean_std(&r);
                m.eval_return_mean = Some(em);
                m.eval_return_std = Some(es);
            }
            if let Some(w) = metrics.as_deref_mut() {
                w.write(&m)?;
            }
            let ckpt_due = self.cfg.checkpoint_every > 0 && self.counters.env_steps >= self.counters.next_checkpoint;
            if finished || ckpt_due {
                while self.cfg.checkpoint_every > 0 && self.counters.next_checkpoint <= self.counters.env_steps {
                    self.counters.next_checkpoint += self.cfg.checkpoint_every;
                }
                // The segment boundary does not depend on whether a folder
                // was given, so runs with and without checkpoints agree.
                self.new_segment(self.counters.segment + 1)?;
                if let Some(dir) = checkpoint_dir {
                    self.save_checkpoint(dir)?;
                }
            }
            on_update(&m);
            all.push(m);
        }
        Ok(all)
    }

    /// Writes `ckpt-<update>.safetensors` (weights, Adam moments) and then
    /// `ckpt-<update>.json` (everything else) into `dir`, both atomically,
    /// and keeps the two newest checkpoints. Returns the JSON path.
    ///
    /// Environment state is not saved: call this right after starting a new
    /// environment segment (as [`Trainer::run`] does) so that a resumed run
    /// continues exactly.
    pub fn save_checkpoint(&self, dir: &Path) -> TrainResult<PathBuf> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::File { path: dir.into(), message: e.to_string() })?;
        let stem = format!("ckpt-{:08}", self.counters.update);
        let weights = format!("{stem}.safetensors");
        let mut tensors = std::collections::HashMap::new();
        for (i, (name, p)) in self.params.iter().enumerate() {
            tensors.insert(format!("param/{name}"), p.as_tensor().detach());
            tensors.insert(format!("adam_m/{name}"), Tensor::from_slice(&self.adam.m[i], p.shape(), &Device::Cpu)?);
            tensors.insert(format!("adam_v/{name}"), Tensor::from_slice(&self.adam.v[i], p.shape(), &Device::Cpu)?);
        }
        // candle writes straight to a path; write a scratch file and move
        // its bytes into place atomically.
        let scratch = dir.join(format!(".{weights}.partial"));
        candle_core::safetensors::save(&tensors, &scratch)?;
        let bytes =
            std::fs::read(&scratch).map_err(|e| TrainError::File { path: scratch.clone(), message: e.to_string() })?;
        atomic_write(&dir.join(&weights), &bytes)?;
        let _ = std::fs::remove_file(&scratch);
        let state = CheckpointState {
            format: CHECKPOINT_FORMAT,
            config: self.cfg.clone(),
            counters: self.counters.clone(),
            rng: self.rng.clone(),
            obs_stats: self.segment_stats.clone(),
            dual: self.dual.clone(),
            adam_steps: self.adam.t,
            weights,
        };
        let json = dir.join(format!("{stem}.json"));
        atomic_write_json(&json, &state)?;
        // Keep the two newest checkpoints.
        let mut all = list_checkpoints(dir)?;
        while all.len() > 2 {
            let (_, old) = all.remove(0);
            if let Ok(s) = read_state(&old) {
                let _ = std::fs::remove_file(dir.join(s.weights));
            }
            let _ = std::fs::remove_file(old);
        }
        Ok(json)
    }

    /// Restores the newest checkpoint in `dir`. `config` replaces the saved
    /// config (e.g. with a larger `total_env_steps`) when given; everything
    /// that shapes the networks must stay the same.
    pub fn resume(dir: &Path, config: Option<TrainConfig>) -> TrainResult<Self> {
        let json = latest_checkpoint(dir)?;
        let state = read_state(&json)?;
        let cfg = config.unwrap_or_else(|| state.config.clone());
        for (field, same) in [
            ("task", cfg.task == state.config.task),
            ("policy", cfg.policy == state.config.policy),
            ("num_envs", cfg.num_envs == state.config.num_envs),
            ("seed", cfg.seed == state.config.seed),
        ] {
            if !same {
                return Err(TrainError::Config {
                    field: field.into(),
                    message: format!("differs from the checkpoint {}; a resumed run must keep it", json.display()),
                });
            }
        }
        let mut t = Self::new(cfg)?;
        let wpath = dir.join(&state.weights);
        let tensors = candle_core::safetensors::load(&wpath, &Device::Cpu)
            .map_err(|e| TrainError::File { path: wpath.clone(), message: e.to_string() })?;
        let get = |key: String| -> TrainResult<Vec<f32>> {
            let t = tensors
                .get(&key)
                .ok_or_else(|| TrainError::File { path: wpath.clone(), message: format!("no tensor `{key}`") })?;
            Ok(t.flatten_all()?.to_vec1::<f32>()?)
        };
        let mut params = std::collections::HashMap::new();
        for (i, (name, p)) in t.params.iter().enumerate() {
            params.insert(
                name.clone(),
                tensors.get(&format!("param/{name}")).cloned().ok_or_else(|| TrainError::File {
                    path: wpath.clone(),
                    message: format!("no tensor `param/{name}`"),
                })?,
            );
            let (m, v) = (get(format!("adam_m/{name}"))?, get(format!("adam_v/{name}"))?);
            if m.len() != p.elem_count() || v.len() != p.elem_count() {
                return Err(TrainError::File {
                    path: wpath.clone(),
                    message: format!("Adam moments of `{name}` have the wrong size"),
                });
            }
            t.adam.m[i] = m;
            t.adam.v[i] = v;
        }
        t.net.load_state_dict(&params)?;
        t.fast = NativeNet::from_net(&t.net)?;
        t.adam.t = state.adam_steps;
        t.rng = state.rng;
        t.dual = state.dual;
        t.counters = state.counters;
        t.env.set_obs_stats(state.obs_stats)?;
        let seg = t.counters.segment;
        t.new_segment(seg)?;
        Ok(t)
    }
}

fn read_state(path: &Path) -> TrainResult<CheckpointState> {
    let text =
        std::fs::read_to_string(path).map_err(|e| TrainError::File { path: path.into(), message: e.to_string() })?;
    let s: CheckpointState = serde_json::from_str(&text)
        .map_err(|e| TrainError::File { path: path.into(), message: format!("invalid checkpoint: {e}") })?;
    if s.format != CHECKPOINT_FORMAT {
        return Err(TrainError::File {
            path: path.into(),
            message: format!("checkpoint format {} (this build reads {CHECKPOINT_FORMAT})", s.format),
        });
    }
    Ok(s)
}

/// `(update, path)` of every `ckpt-*.json` in `dir`, oldest first.
fn list_checkpoints(dir: &Path) -> TrainResult<Vec<(u64, PathBuf)>> {
    let rd = std::fs::read_dir(dir).map_err(|e| TrainError::File { path: dir.into(), message: e.to_string() })?;
    let mut out: Vec<(u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let num = name.strip_prefix("ckpt-")?.strip_suffix(".json")?.parse::<u64>().ok()?;
            Some((num, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The newest checkpoint JSON in `dir`.
pub fn latest_checkpoint(dir: &Path) -> TrainResult<PathBuf> {
    list_checkpoints(dir)?.pop().map(|(_, p)| p).ok_or_else(|| TrainError::File {
        path: dir.into(),
        message: "no checkpoint (ckpt-*.json) in this folder".into(),
    })
}

/// Loads the networks and observation statistics of the newest checkpoint
/// in `dir` (for evaluation).
pub fn load_policy(dir: &Path) -> TrainResult<(TrainConfig, ActorCritic, RunningMeanStd)> {
    let json = latest_checkpoint(dir)?;
    let state = read_state(&json)?;
    let spec = crate::tasks::task_spec(&state.config.task)?;
    let model = crate::env::load_task_model(spec, state.config.suite_dir.as_deref())?;
    let probe = crate::env::Env::with_model(spec, model, 0)?;
    let net = ActorCritic::new(&state.config.policy, probe.observation_dim(), probe.action_dim(), 0)?;
    let wpath = dir.join(&state.weights);
    let tensors = candle_core::safetensors::load(&wpath, &Device::Cpu)
        .map_err(|e| TrainError::File { path: wpath.clone(), message: e.to_string() })?;
    let params =
        tensors.into_iter().filter_map(|(k, v)| k.strip_prefix("param/").map(|n| (n.to_string(), v))).collect();
    net.load_state_dict(&params)?;
    Ok((state.config, net, state.obs_stats))
}

/// Deterministic evaluation of `net` (see [`Trainer::evaluate`]) on
/// environments seeded with `seed`.
pub fn evaluate_policy(
    cfg: &TrainConfig,
    net: &ActorCritic,
    obs_stats: &RunningMeanStd,
    episodes: usize,
    seed: u64,
) -> TrainResult<Vec<f64>> {
    if episodes == 0 {
        return Ok(Vec::new());
    }
    let mut env = VecEnv::new(cfg.env_config(episodes, seed))?;
    env.set_update_stats(false);
    env.set_obs_stats(obs_stats.clone())?;
    let (d, a) = (env.observation_dim(), env.action_dim());
    let mut obs: Vec<f32> = env.reset()?.iter().map(|&x| x as f32).collect();
    let mut returns: Vec<Option<f64>> = vec![None; episodes];
    let mut actions = vec![0f64; episodes * a];
    // Unstable episodes restart; give up after a generous number of steps.
    let limit = 20 * env.episode_steps();
    for _ in 0..limit {
        let mean =
            net.dist(&Tensor::from_slice(&obs, (episodes, d), &Device::Cpu)?)?.mean.flatten_all()?.to_vec1::<f32>()?;
        for (x, &m) in actions.iter_mut().zip(&mean) {
            *x = f64::from(m).clamp(-1.0, 1.0);
        }
        let step = env.step(&actions)?;
        for (o, &x) in obs.iter_mut().zip(&step.obs) {
            *o = x as f32;
        }
        for e in env.drain_finished() {
            if !e.unstable && returns[e.env].is_none() {
                returns[e.env] = Some(e.ret);
            }
        }
        if returns.iter().all(Option::is_some) {
            break;
        }
    }
    Ok(returns.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(task: &str) -> TrainConfig {
        TrainConfig {
            task: task.into(),
            total_env_steps: 4 * 16 * 3,
            num_envs: 4,
            unroll: 8,
            batch_size: 4,
            minibatches: 2,
            epochs: 2,
            eval_every: 0,
            eval_episodes: 0,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn first_minibatch_ratios_are_exactly_one() {
        // batch_size 12: 96-row minibatches while the rollout's forward
        // passes are 4 rows (a row's result must not depend on the batch).
        for (algo, batch_size) in [("ppo", 4), ("r2vpo", 4), ("ppo", 12)] {
            let mut cfg = tiny("cheetah-run");
            cfg.batch_size = batch_size;
            cfg.objective.kind = if algo == "ppo" { ObjectiveKind::Clip } else { ObjectiveKind::R2vpo };
            let mut t = Trainer::new(cfg).unwrap();
            for _ in 0..2 {
                let m = t.update().unwrap();
                assert_eq!(m.first_minibatch_ratio_dev, 0.0, "{algo}: {m:?}");
                // Later minibatches moved the policy.
                assert!(m.ratio_var > 0.0, "{algo}: {m:?}");
            }
        }
    }

    #[test]
    fn rollout_stores_the_pre_clip_sample_and_its_log_prob() {
        let mut t = Trainer::new(tiny("cartpole-balance")).unwrap();
        t.rollout().unwrap();
        let (rows, d, a) = (t.buf.logp.len(), t.net.obs_dim(), t.net.act_dim());
        // σ = 1 at init: about a third of the samples lie outside the action box.
        let outside = t.buf.actions.iter().filter(|x| x.abs() > 1.0).count();
        assert!(outside > rows / 10, "{outside} of {rows} stored actions outside [-1, 1]: stored clipped?");
        let dev = &Device::Cpu;
        let obs = Tensor::from_slice(&t.buf.obs, (rows, d), dev).unwrap();
        let dist = t.net.dist(&obs).unwrap();
        let act = Tensor::from_slice(&t.buf.actions, (rows, a), dev).unwrap();
        let lp = crate::policy::gaussian_log_prob(&dist.mean, &dist.log_std, &act).unwrap().to_vec1::<f32>().unwrap();
        for (i, (&got, &want)) in t.buf.logp.iter().zip(&lp).enumerate() {
            assert!((got - want).abs() < 1e-5, "row {i}: stored log π {got}, recomputed {want}");
        }
        // The log-prob of the clipped action is a different number: the check
        // above would catch a rollout that scored the env's action instead.
        let clipped = act.clamp(-1f32, 1f32).unwrap();
        let lp_clipped =
            crate::policy::gaussian_log_prob(&dist.mean, &dist.log_std, &clipped).unwrap().to_vec1::<f32>().unwrap();
        assert!(lp.iter().zip(&lp_clipped).any(|(x, y)| (x - y).abs() > 1e-3));
    }

    #[test]
    fn adam_clips_the_global_gradient_norm() {
        let p1 = Var::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        let p2 = Var::new(&[3.0f32], &Device::Cpu).unwrap();
        let params = vec![("a".to_string(), p1.clone()), ("b".to_string(), p2.clone())];
        // loss = 3·Σa + 4·b: gradient (3, 3, 4), norm √34.
        let loss = (p1.as_tensor().sum_all().unwrap() * 3.0)
            .unwrap()
            .add(&(p2.as_tensor().sum_all().unwrap() * 4.0).unwrap())
            .unwrap();
        let grads = loss.backward().unwrap();
        let mut sgd_like = Adam::new(&params, 0.1, 0.0, 0.0, 0.0);
        let norm = sgd_like.step(&params, &grads, 1.0).unwrap();
        assert!((norm - 34f64.sqrt()).abs() < 1e-6);
        // With β = 0 and ε = 0 Adam's step is lr·sign(g): clipping a common
        // scale must not change it, so check the moments instead.
        let s = 1.0 / (34f64.sqrt() + 1e-6);
        assert!((f64::from(sgd_like.m[0][0]) - 3.0 * s).abs() < 1e-6, "{:?}", sgd_like.m);
        assert!((f64::from(sgd_like.m[1][0]) - 4.0 * s).abs() < 1e-6);
        let clipped_norm: f64 = sgd_like.m.iter().flatten().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
        assert!((clipped_norm - 1.0).abs() < 1e-5);
        let w = p1.as_tensor().to_vec1::<f32>().unwrap();
        assert!((w[0] - 0.9).abs() < 1e-6 && (w[1] - 1.9).abs() < 1e-6, "{w:?}");
        // Below the threshold nothing is scaled.
        let mut free = Adam::new(&params, 0.1, 0.0, 0.0, 0.0);
        free.step(&params, &grads, 100.0).unwrap();
        assert!((free.m[1][0] - 4.0).abs() < 1e-6);
    }

    #[test]
    fn next_values_bootstrap_from_final_obs_only_on_truncation() {
        let mut t = Trainer::new(tiny("cartpole-balance")).unwrap();
        let n = 4;
        // Fake a 3-step rollout: env 1 truncates at t = 0, env 2 is unstable at t = 1.
        t.buf.values = (0..3 * n).map(|i| i as f32).collect();
        t.buf.truncated = vec![false; 3 * n];
        t.buf.terminated = vec![false; 3 * n];
        t.buf.final_values = vec![0.0; 3 * n];
        t.buf.truncated[1] = true;
        t.buf.final_values[1] = 100.0;
        t.buf.terminated[n + 2] = true;
        t.buf.rewards = vec![1.0; 3 * n];
        let next = t.next_values().unwrap();
        // The candle forward is an independent implementation of V.
        let obs = Tensor::from_slice(&t.obs, (n, t.net.obs_dim()), &Device::Cpu).unwrap();
        let boot = t.net.value(&obs).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(next[0], 4.0);
        assert_eq!(next[1], 100.0, "truncation bootstraps from V(final_obs)");
        assert_eq!(next[n + 2], 10.0, "unstable: next value is ignored by GAE, not replaced");
        assert!(next[2 * n..].iter().zip(&boot).all(|(x, y)| (x - y).abs() < 1e-5), "{next:?} vs {boot:?}");
        let gcfg = GaeConfig { gamma: 0.5, lambda: 1.0 };
        let (adv, _) =
            gae(&t.buf.rewards, &t.buf.values, &next, &t.buf.terminated, &t.buf.truncated, n, &gcfg).unwrap();
        // Truncated: δ = r + γ·V(final) − V, no trace across the reset.
        assert!((adv[1] - (1.0 + 0.5 * 100.0 - 1.0)).abs() < 1e-4);
        // Unstable: δ = r − V, no bootstrap at all.
        assert!((adv[n + 2] - (1.0 - 6.0)).abs() < 1e-4);
    }

    #[test]
    fn real_truncation_records_final_values() {
        // cartpole episodes are 1000 steps: 4 envs × 1000 steps exactly.
        let cfg = TrainConfig {
            total_env_steps: 4000,
            unroll: 125,
            batch_size: 4,
            minibatches: 1,
            ..tiny("cartpole-balance")
        };
        assert_eq!(cfg.rollout_len(), 125);
        let mut t = Trainer::new(cfg).unwrap();
        let mut episodes = 0;
        for _ in 0..8 {
            episodes += t.rollout().unwrap().len();
        }
        assert_eq!(episodes, 4);
        let last = t.buf.truncated.len() - 4;
        assert!(t.buf.truncated[last..].iter().all(|&x| x));
        assert!(t.buf.final_values[last..].iter().all(|&v| v != 0.0));
        assert!(t.buf.final_values[..last].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn resume_repeats_the_uninterrupted_run() {
        let dir = tempfile::tempdir().unwrap();
        let per_update = 4 * 16;
        let cfg = TrainConfig {
            total_env_steps: 6 * per_update,
            checkpoint_every: 3 * per_update,
            eval_every: 3 * per_update,
            eval_episodes: 2,
            objective: ObjectiveConfig { kind: ObjectiveKind::R2vpo, ..ObjectiveConfig::default() },
            ..tiny("cartpole-balance")
        };
        let a_dir = dir.path().join("a");
        let full = Trainer::new(cfg.clone()).unwrap().run(Some(&a_dir), None, |_| {}).unwrap();
        assert_eq!(full.len(), 6);
        let b_dir = dir.path().join("b");
        let first = Trainer::new(TrainConfig { total_env_steps: 3 * per_update, ..cfg.clone() })
            .unwrap()
            .run(Some(&b_dir), None, |_| {})
            .unwrap();
        let mut resumed = Trainer::resume(&b_dir, Some(cfg.clone())).unwrap();
        assert_eq!(resumed.counters().update, 3);
        let rest = resumed.run(Some(&b_dir), None, |_| {}).unwrap();
        let joined: Vec<_> = first.iter().chain(&rest).map(UpdateMetrics::without_timing).collect();
        let full: Vec<_> = full.iter().map(UpdateMetrics::without_timing).collect();
        assert_eq!(joined, full);
        assert!(full[2].eval_return_mean.is_some() && full[5].eval_return_mean.is_some());
        // The policy loads back for evaluation.
        let (c, net, stats) = load_policy(&b_dir).unwrap();
        let r = evaluate_policy(&c, &net, &stats, 2, 9).unwrap();
        assert_eq!(r.len(), 2);
    }

    /// Learning smoke test (~20 s in the dev profile) with the old large-
    /// minibatch schedule: on cheetah-run the first round of episodes is the
    /// random policy (≈ 20–40); later rounds must beat it clearly. The
    /// default config's cartpole-balance check is `tests/learning.rs`.
    #[test]
    fn cheetah_run_return_increases() {
        let cfg = TrainConfig {
            task: "cheetah-run".into(),
            total_env_steps: 16 * 5000,
            num_envs: 16,
            unroll: 32,
            batch_size: 16,
            minibatches: 4,
            epochs: 8,
            lr: 1e-3,
            eval_every: 0,
            eval_episodes: 0,
            ..TrainConfig::default()
        };
        let mut t = Trainer::new(cfg).unwrap();
        let log = t.run(None, None, |_| {}).unwrap();
        let rounds: Vec<f64> = log.iter().filter_map(|m| m.episode_return_mean).collect();
        eprintln!("per-round returns: {rounds:?}");
        assert!(rounds.len() >= 4, "{rounds:?}");
        let later = rounds[2..].iter().sum::<f64>() / (rounds.len() - 2) as f64;
        assert!(later > rounds[0] + 50.0, "return did not increase: {rounds:?}");
    }
}
