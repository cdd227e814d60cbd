//! Vectorised environments: N [`Env`]s over one shared model, stepped in
//! parallel with rayon, with auto-reset, running observation normalisation
//! and reward scaling.
//!
//! Every environment owns its RNG (seeded from the vector's seed and its
//! index) and its `MjData`; statistics are updated sequentially in
//! environment order after each parallel step. Results are therefore
//! identical for a given seed whatever the number of rayon threads (run
//! `step` inside `ThreadPool::install` to pick a pool).

use std::path::PathBuf;

use rand::{RngCore, SeedableRng};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::env::{load_task_model, Env};
use crate::error::{Error, Result};
use crate::tasks::{task_spec, TaskRng};

/// Configuration of a [`VecEnv`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VecEnvConfig {
    /// Registry task name, e.g. `cheetah-run`.
    pub task: String,
    /// Number of environments.
    pub num_envs: usize,
    /// Master seed.
    pub seed: u64,
    /// Normalise observations with running statistics.
    pub normalize_obs: bool,
    /// Normalised observations are clipped to `±obs_clip`.
    pub obs_clip: f64,
    /// Rewards handed to the learner are `reward_scale × reward`.
    pub reward_scale: f64,
    /// Suite folder override (else `$R2VPO_DMC_SUITE` or `.deps`).
    pub suite_dir: Option<PathBuf>,
}

impl VecEnvConfig {
    /// Defaults: normalisation on, clip 10, reward scale 1.
    pub fn new(task: &str, num_envs: usize, seed: u64) -> Self {
        Self {
            task: task.to_string(),
            num_envs,
            seed,
            normalize_obs: true,
            obs_clip: 10.0,
            reward_scale: 1.0,
            suite_dir: None,
        }
    }
}

/// Running mean and variance (Chan et al.'s parallel Welford update).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunningMeanStd {
    /// Per-dimension mean.
    pub mean: Vec<f64>,
    /// Per-dimension population variance.
    pub var: Vec<f64>,
    /// Number of samples seen.
    pub count: f64,
}

impl RunningMeanStd {
    /// Added to the variance before the square root.
    pub const EPS: f64 = 1e-8;

    /// Empty statistics over `dim` dimensions.
    pub fn new(dim: usize) -> Self {
        Self { mean: vec![0.0; dim], var: vec![1.0; dim], count: 0.0 }
    }

    /// Folds in a batch of row-major samples (`rows × dim`).
    pub fn update(&mut self, batch: &[f64]) {
        let dim = self.mean.len();
        if dim == 0 || batch.is_empty() {
            return;
        }
        let n = (batch.len() / dim) as f64;
        let mut bmean = vec![0.0; dim];
        for row in batch.chunks_exact(dim) {
            for (m, x) in bmean.iter_mut().zip(row) {
                *m += x;
            }
        }
        bmean.iter_mut().for_each(|m| *m /= n);
        let mut bvar = vec![0.0; dim];
        for row in batch.chunks_exact(dim) {
            for ((v, x), m) in bvar.iter_mut().zip(row).zip(&bmean) {
                *v += (x - m) * (x - m);
            }
        }
        bvar.iter_mut().for_each(|v| *v /= n);
        if self.count == 0.0 {
            self.mean = bmean;
            self.var = bvar;
            self.count = n;
            return;
        }
        let total = self.count + n;
        for i in 0..dim {
            let delta = bmean[i] - self.mean[i];
            let m2 = self.var[i] * self.count + bvar[i] * n + delta * delta * self.count * n / total;
            self.mean[i] += delta * n / total;
            self.var[i] = m2 / total;
        }
        self.count = total;
    }

    /// `clip((x − mean)/sqrt(var + EPS), ±clip)` in place, row-major.
    pub fn normalize(&self, xs: &mut [f64], clip: f64) {
        let dim = self.mean.len();
        for row in xs.chunks_exact_mut(dim) {
            for ((x, m), v) in row.iter_mut().zip(&self.mean).zip(&self.var) {
                *x = ((*x - m) / (v + Self::EPS).sqrt()).clamp(-clip, clip);
            }
        }
    }
}

/// A finished episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeStats {
    /// Index of the environment.
    pub env: usize,
    /// Undiscounted return (unscaled rewards).
    pub ret: f64,
    /// Control steps.
    pub length: usize,
    /// Ended by MuJoCo warnings instead of the time limit.
    pub unstable: bool,
}

/// Output of one vectorised step (row-major `num_envs × dim` arrays).
#[derive(Debug, Clone, Default)]
pub struct VecStep {
    /// Observation to act on next: the reset observation where an episode
    /// ended (normalised if enabled).
    pub obs: Vec<f64>,
    /// Scaled rewards.
    pub rewards: Vec<f64>,
    /// Unscaled rewards.
    pub raw_rewards: Vec<f64>,
    /// The episode hit its time limit: bootstrap from `final_obs`.
    pub truncated: Vec<bool>,
    /// The episode ended on a MuJoCo warning (invalid state): treat as
    /// terminal, `final_obs` is not meaningful.
    pub unstable: Vec<bool>,
    /// Last observation of each episode that ended this step (normalised
    /// like `obs`); rows of running environments are zero.
    pub final_obs: Vec<f64>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Outcome {
    reward: f64,
    truncated: bool,
    unstable: bool,
}

/// N environments of one task stepped in parallel.
#[derive(Debug)]
pub struct VecEnv {
    config: VecEnvConfig,
    envs: Vec<Env>,
    obs_dim: usize,
    act_dim: usize,
    raw_obs: Vec<f64>,
    outcomes: Vec<Outcome>,
    out: VecStep,
    obs_rms: RunningMeanStd,
    update_stats: bool,
    returns: Vec<f64>,
    lengths: Vec<usize>,
    finished: Vec<EpisodeStats>,
    warning_resets: u64,
}

impl VecEnv {
    /// Loads the task's model once and builds `num_envs` environments on it.
    pub fn new(config: VecEnvConfig) -> Result<Self> {
        if config.num_envs == 0 {
            return Err(Error::InvalidConfig { field: "num_envs", message: "must be at least 1".into() });
        }
        let spec = task_spec(&config.task)?;
        let model = load_task_model(spec, config.suite_dir.as_deref())?;
        let mut master = TaskRng::seed_from_u64(config.seed);
        let envs = (0..config.num_envs)
            .map(|_| Env::with_model(spec, model.clone(), master.next_u64()))
            .collect::<Result<Vec<_>>>()?;
        let (obs_dim, act_dim) = (envs[0].observation_dim(), envs[0].action_dim());
        let n = config.num_envs;
        Ok(Self {
            envs,
            obs_dim,
            act_dim,
            raw_obs: vec![0.0; n * obs_dim],
            outcomes: vec![Outcome::default(); n],
            out: VecStep {
                obs: vec![0.0; n * obs_dim],
                rewards: vec![0.0; n],
                raw_rewards: vec![0.0; n],
                truncated: vec![false; n],
                unstable: vec![false; n],
                final_obs: vec![0.0; n * obs_dim],
            },
            obs_rms: RunningMeanStd::new(obs_dim),
            update_stats: true,
            returns: vec![0.0; n],
            lengths: vec![0; n],
            finished: Vec::new(),
            warning_resets: 0,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VecEnvConfig {
        &self.config
    }

    /// Environment `i` (for drawing it; stepping goes through [`VecEnv::step`]).
    ///
    /// # Panics
    /// When `i` is not below [`VecEnv::num_envs`].
    pub fn env(&self, i: usize) -> &Env {
        &self.envs[i]
    }

    /// Number of environments.
    pub fn num_envs(&self) -> usize {
        self.envs.len()
    }

    /// Observation length per environment.
    pub fn observation_dim(&self) -> usize {
        self.obs_dim
    }

    /// Action length per environment.
    pub fn action_dim(&self) -> usize {
        self.act_dim
    }

    /// Control steps per episode.
    pub fn episode_steps(&self) -> usize {
        self.envs[0].episode_steps()
    }

    /// Episodes reset because MuJoCo raised warnings.
    pub fn warning_resets(&self) -> u64 {
        self.warning_resets
    }

    /// Freezes (`false`) or resumes (`true`) the observation statistics, e.g.
    /// for evaluation.
    pub fn set_update_stats(&mut self, update: bool) {
        self.update_stats = update;
    }

    /// The observation statistics (save them with checkpoints).
    pub fn obs_stats(&self) -> &RunningMeanStd {
        &self.obs_rms
    }

    /// Restores saved observation statistics.
    pub fn set_obs_stats(&mut self, stats: RunningMeanStd) -> Result<()> {
        if stats.mean.len() != self.obs_dim || stats.var.len() != self.obs_dim {
            return Err(Error::BadLength {
                task: self.envs[0].name(),
                field: "obs_stats",
                got: stats.mean.len(),
                expected: self.obs_dim,
            });
        }
        self.obs_rms = stats;
        Ok(())
    }

    /// Episodes finished since the last call.
    pub fn drain_finished(&mut self) -> Vec<EpisodeStats> {
        std::mem::take(&mut self.finished)
    }

    /// The unnormalised current observations.
    pub fn raw_observations(&self) -> &[f64] {
        &self.raw_obs
    }

    /// Resets every environment; returns the (normalised) observations.
    pub fn reset(&mut self) -> Result<&[f64]> {
        let d = self.obs_dim;
        self.envs.par_iter_mut().zip(self.raw_obs.par_chunks_mut(d)).try_for_each(|(env, obs)| env.reset_into(obs))?;
        self.returns.iter_mut().for_each(|r| *r = 0.0);
        self.lengths.iter_mut().for_each(|l| *l = 0);
        if self.update_stats && self.config.normalize_obs {
            self.obs_rms.update(&self.raw_obs);
        }
        self.out.obs.copy_from_slice(&self.raw_obs);
        if self.config.normalize_obs {
            self.obs_rms.normalize(&mut self.out.obs, self.config.obs_clip);
        }
        Ok(&self.out.obs)
    }

    /// Steps every environment with its row of `actions` (`num_envs ×
    /// action_dim`), resetting those whose episode ended.
    pub fn step(&mut self, actions: &[f64]) -> Result<&VecStep> {
        let (d, a) = (self.obs_dim, self.act_dim);
        if actions.len() != self.envs.len() * a {
            return Err(Error::BadLength {
                task: self.envs[0].name(),
                field: "actions",
                got: actions.len(),
                expected: self.envs.len() * a,
            });
        }
        self.envs
            .par_iter_mut()
            .zip(self.raw_obs.par_chunks_mut(d))
            .zip(self.out.final_obs.par_chunks_mut(d))
            .zip(actions.par_chunks(a))
            .zip(self.outcomes.par_iter_mut())
            .try_for_each(|((((env, obs), fin), act), outcome)| -> Result<()> {
                let r = env.step_into(act, obs);
                *outcome = Outcome { reward: r.reward, truncated: r.truncated, unstable: r.warning.is_some() };
                if r.truncated {
                    fin.copy_from_slice(obs);
                } else {
                    fin.iter_mut().for_each(|x| *x = 0.0);
                }
                if r.truncated || r.warning.is_some() {
                    env.reset_into(obs)?;
                }
                Ok(())
            })?;

        for (i, o) in self.outcomes.iter().enumerate() {
            self.out.raw_rewards[i] = o.reward;
            self.out.rewards[i] = o.reward * self.config.reward_scale;
            self.out.truncated[i] = o.truncated;
            self.out.unstable[i] = o.unstable;
            self.returns[i] += o.reward;
            self.lengths[i] += 1;
            if o.unstable {
                self.warning_resets += 1;
            }
            if o.truncated || o.unstable {
                self.finished.push(EpisodeStats {
                    env: i,
                    ret: self.returns[i],
                    length: self.lengths[i],
                    unstable: o.unstable,
                });
                self.returns[i] = 0.0;
                self.lengths[i] = 0;
            }
        }
        if self.update_stats && self.config.normalize_obs {
            self.obs_rms.update(&self.raw_obs);
        }
        self.out.obs.copy_from_slice(&self.raw_obs);
        if self.config.normalize_obs {
            let clip = self.config.obs_clip;
            self.obs_rms.normalize(&mut self.out.obs, clip);
            for (i, fin) in self.out.final_obs.chunks_exact_mut(d).enumerate() {
                if self.out.truncated[i] {
                    self.obs_rms.normalize(fin, clip);
                }
            }
        }
        Ok(&self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_matches_two_pass() {
        let xs: Vec<f64> = (0..30).map(|i| ((i * 7) % 11) as f64 * 0.3 - 1.0).collect();
        let mut rms = RunningMeanStd::new(3);
        for chunk in xs.chunks(9) {
            rms.update(chunk);
        }
        for j in 0..3 {
            let col: Vec<f64> = xs.iter().skip(j).step_by(3).copied().collect();
            let m = col.iter().sum::<f64>() / col.len() as f64;
            let v = col.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / col.len() as f64;
            assert!((rms.mean[j] - m).abs() < 1e-12 && (rms.var[j] - v).abs() < 1e-12);
        }
        let json = serde_json::to_string(&rms).unwrap();
        assert_eq!(serde_json::from_str::<RunningMeanStd>(&json).unwrap(), rms);
    }
}
