//! The on-policy actor-critic trainer shared by PPO and R²VPO.
//!
//! Files by phase: [`config`](TrainConfig), `rollout` (collect into flat
//! buffers), `update` (GAE, then the core's [`EpochSchedule`] of minibatches
//! through the core's [`Learner`]), `eval`, `checkpoint`, and the run loop
//! here.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use r2vpo::advantage::{gae, GaeConfig};
use r2vpo::aggregate::GlobalBatch;
use r2vpo::dual::{DualConfig, DualVariable};
use r2vpo::learner::Learner;
use r2vpo::objective::{ObjectiveConfig, PolicyBatch, RatioStats};
use r2vpo::schedule::{EpochSchedule, Remainder, Reshuffle};
use r2vpo::seed::derived_seed;
use r2vpo::stats::mean_std;
use r2vpo_report::{atomic_write, atomic_write_json};

use crate::brax::ObsNormalizer;
use crate::error::config_err;
use crate::native::NativeNet;
use crate::policy::{ActorCritic, PolicyConfig};
use crate::vec_env::{EpisodeStats, RunningMeanStd, VecEnv, VecEnvConfig};
use crate::video::{Recorder, VideoFile, VideoTarget};
use std::sync::Arc;

mod brax_update;
mod checkpoint;
mod config;
mod eval;
mod metrics;
mod optim;
mod rollout;
mod update;

pub use crate::error::{TrainError, TrainResult};
pub use checkpoint::{latest_checkpoint, load_policy, CheckpointState, SavedPolicy};
pub use config::{algo_overrides, default_config, Flavour, NormRefresh, TrainConfig, DEFAULT_CONFIG};
pub use eval::{evaluate_policy, evaluate_policy_recorded, EvalPolicy};
pub use metrics::{Counters, UpdateMetrics};
pub use optim::Adam;

use rollout::Rollout;

// The trainer's random streams (r2vpo::seed::derived_seed), fixed because
// committed results depend on them.
const TAG_INIT: u64 = 1;
const TAG_SAMPLING: u64 = 2;
const TAG_ENV: u64 = 3;
const TAG_EVAL: u64 = 4;

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
    /// The objective and λ (the core's learner contract).
    learner: Learner,
    rng: ChaCha8Rng,
    obs: Vec<f32>,
    counters: Counters,
    buf: Rollout,
    /// Observation statistics at the start of the current segment, before
    /// its reset observations were folded in: what a checkpoint saves, so
    /// that the resumed segment's reset folds them in exactly once.
    segment_stats: RunningMeanStd,
    /// Brax's in-network observation normaliser (brax flavour with
    /// `normalize_obs`).
    obs_norm: Option<ObsNormalizer>,
    /// Where filmed evaluations go (`video.every`), and the still of the
    /// first one (see [`Trainer::set_video_dir`]).
    video_dir: Option<(PathBuf, PathBuf)>,
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
        let mut fast = NativeNet::from_net(&net)?;
        let obs_norm =
            (cfg.flavour == Flavour::Brax && cfg.normalize_obs).then(|| ObsNormalizer::new(env.observation_dim()));
        fast.set_obs_norm(obs_norm.as_ref().map(ObsNormalizer::mean_std));
        let adam = Adam::new(&params, cfg.lr, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps);
        let learner = Learner::new(cfg.objective.clone(), &cfg.dual)?;
        let rng = ChaCha8Rng::seed_from_u64(derived_seed(cfg.seed, TAG_SAMPLING, 0));
        let counters = Counters {
            next_eval: cfg.eval_every,
            next_checkpoint: cfg.checkpoint_every,
            next_video: cfg.video.every,
            ..Counters::default()
        };
        let segment_stats = env.obs_stats().clone();
        let mut t = Self {
            cfg,
            env,
            net,
            fast,
            params,
            adam,
            learner,
            rng,
            obs: Vec::new(),
            counters,
            buf: Rollout::default(),
            segment_stats,
            obs_norm,
            video_dir: None,
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

    /// Current observation statistics (the cleanrl flavour's, kept by the
    /// environments).
    pub fn obs_stats(&self) -> &RunningMeanStd {
        self.env.obs_stats()
    }

    /// Brax's in-network observation normaliser (brax flavour with
    /// `normalize_obs`).
    pub fn obs_normalizer(&self) -> Option<&ObsNormalizer> {
        self.obs_norm.as_ref()
    }

    /// Films evaluations as `video.every` says: `videos/eval-<env steps>.mp4`
    /// under `dir`, and a frame of the first one as `still` (if no file is
    /// there yet). Without this call no video is recorded.
    pub fn set_video_dir(&mut self, dir: &Path, still: &Path) {
        self.video_dir = Some((dir.to_path_buf(), still.to_path_buf()));
    }

    /// The current λ.
    pub fn lambda(&self) -> f64 {
        self.learner.lambda()
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

    /// Trains until the budget is spent or `stop` is raised, evaluating and
    /// checkpointing on schedule; every update's metrics go to `metrics` (if
    /// given) and to `on_update`. Checkpoints go to `checkpoint_dir` (if
    /// given). A raised `stop` ends the run after the current update with a
    /// checkpoint there; the run continues from it, though not bit for bit
    /// as it would have without the stop (a checkpoint starts a new
    /// environment segment, see the module docs).
    pub fn run(
        &mut self,
        checkpoint_dir: Option<&Path>,
        mut metrics: Option<&mut r2vpo_report::JsonlWriter>,
        stop: &AtomicBool,
        mut on_update: impl FnMut(&UpdateMetrics),
    ) -> TrainResult<Vec<UpdateMetrics>> {
        let mut all = Vec::new();
        while !self.done() {
            let mut m = self.update()?;
            let finished = self.done();
            if self.cfg.eval_episodes > 0
                && (finished || (self.cfg.eval_every > 0 && self.counters.env_steps >= self.counters.next_eval))
            {
                let film = self.video_dir.is_some()
                    && self.cfg.video.every > 0
                    && (finished || self.counters.env_steps >= self.counters.next_video);
                let r = if film {
                    let (dir, still) = self.video_dir.clone().expect("checked");
                    let target = VideoTarget {
                        path: dir.join(format!("eval-{}.mp4", self.counters.env_steps)),
                        still: (!still.exists()).then_some(still),
                    };
                    while self.counters.next_video <= self.counters.env_steps {
                        self.counters.next_video += self.cfg.video.every;
                    }
                    let (r, files) = self.evaluate_filmed(self.cfg.eval_episodes, self.counters.evals, target)?;
                    m.video = files.into_iter().next().map(|f| f.path.display().to_string());
                    r
                } else {
                    self.evaluate(self.cfg.eval_episodes, self.counters.evals)?
                };
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
            let stopping = stop.load(Ordering::SeqCst);
            let save = finished || ckpt_due || stopping;
            if save || self.cfg.reset_every_update {
                while self.cfg.checkpoint_every > 0 && self.counters.next_checkpoint <= self.counters.env_steps {
                    self.counters.next_checkpoint += self.cfg.checkpoint_every;
                }
                // The segment boundary does not depend on whether a folder
                // was given, so runs with and without checkpoints agree;
                // `reset_every_update` makes every update a segment.
                self.new_segment(self.counters.segment + 1)?;
                if let (true, Some(dir)) = (save, checkpoint_dir) {
                    self.save_checkpoint(dir)?;
                }
            }
            on_update(&m);
            all.push(m);
            if stopping {
                break;
            }
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests;
