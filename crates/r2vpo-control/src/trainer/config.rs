//! The `r2vpo control train` config and its named algorithms.

use super::*;

/// Which PPO code base the update follows (`flavour`; the two differ in
/// how advantages, observations and minibatches are made, never in the
/// policy objective, which is always `[objective]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Flavour {
    /// CleanRL's `ppo_continuous_action`: GAE once per update over the whole
    /// rollout with the rollout's critic (truncation bootstraps from
    /// V(final_obs)), environment-side observation normalisation (clipped to
    /// ±`obs_clip`), minibatches of shuffled single transitions, the
    /// previous epoch's order reshuffled.
    #[default]
    Cleanrl,
    /// Brax's PPO (`brax/training/agents/ppo`, the paper's code base through
    /// MuJoCo Playground; [`crate::brax`]): minibatches of `batch_size` whole
    /// `unroll`-step sequences, a fresh permutation each epoch; values and
    /// advantages recomputed with the current critic inside every
    /// minibatch's loss; a truncated step has no δ; Brax's in-network
    /// observation normaliser (updated on the rollout before the epochs, no
    /// clipping; `obs_clip` unused); the tanh-normal's sampled entropy.
    Brax,
}

/// When the brax flavour's observation normaliser takes in a rollout
/// (`obs_norm_refresh`). Brax refreshes it on the rollout before the SGD
/// epochs, so the policy the epochs start from is not the policy that
/// sampled: the first minibatch's ratios differ from 1 by the refresh alone
/// (at 2048 envs |ρ − 1| reached ≈ 1,000 in update 1). PPO's clip ignores
/// such ratios; R²VPO's penalty pulls towards them. The two alternatives
/// make the epochs start at ρ = 1. Tested at 64 envs, `Recompute` did not
/// keep R²VPO at λ 0.06 in its trust region and returned less than Brax's
/// order (results/control/paper-geometry/refresh-64/), so the default
/// stays Brax's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormRefresh {
    /// Brax 0.14.2: refreshed on the rollout before the epochs; the
    /// behaviour log-probs stay those of the sampling policy.
    #[default]
    BeforeEpochs,
    /// Refreshed before the epochs, then every behaviour log-prob is
    /// recomputed by the not-yet-updated networks under the refreshed
    /// normaliser: the ratio's denominator is the policy the epochs start
    /// from (a proximal anchor), not the sampling policy.
    Recompute,
    /// Refreshed after the epochs: the epochs see observations normalised
    /// as the rollout saw them, and the next rollout samples with the
    /// refreshed statistics.
    AfterEpochs,
}

impl NormRefresh {
    fn is_default(&self) -> bool {
        *self == Self::BeforeEpochs
    }
}

/// A full control training run (the `r2vpo control train` config). The
/// defaults are the CPU configuration (`configs/control/cpu.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainConfig {
    /// The update's code base: `"cleanrl"` (default) or `"brax"`.
    pub flavour: Flavour,
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
    /// Brax flavour: when the observation normaliser takes in each rollout,
    /// `"before-epochs"` (Brax's, default), `"recompute"` or
    /// `"after-epochs"` ([`NormRefresh`]).
    #[serde(skip_serializing_if = "NormRefresh::is_default")]
    pub obs_norm_refresh: NormRefresh,
    /// γ and λ of GAE.
    pub gae: GaeConfig,
    /// γ for particular tasks, replacing `gae.gamma` when the run's task is
    /// named here (MuJoCo Playground's per-task `discounting`:
    /// `{ "ball_in_cup-catch" = 0.95, "finger-spin" = 0.95 }`).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub task_gamma: std::collections::BTreeMap<String, f64>,
    /// Reset every environment after every update (current MuJoCo
    /// Playground: `num_resets_per_eval = 10` with one training step per
    /// epoch resets after each, so no training episode outlives one
    /// update's rollout). The rollout's last step bootstraps as at any
    /// rollout end.
    pub reset_every_update: bool,
    /// The policy objective: `kind = "clip"` (PPO) or `"r2vpo"`.
    pub objective: ObjectiveConfig,
    /// λ of R²VPO (fixed 0.06 for control).
    pub dual: DualConfig,
    /// Network shapes and action distribution.
    pub policy: PolicyConfig,
    /// Evaluate every this many env steps (0: only at the end).
    pub eval_every: u64,
    /// Episodes per evaluation (0 disables evaluation), one per environment.
    pub eval_episodes: usize,
    /// Evaluate the distribution's mode (clip(μ) or tanh(μ)) instead of
    /// sampling actions from it. Brax's default (`deterministic_eval =
    /// False`) samples.
    pub eval_deterministic: bool,
    /// Episode videos (`[video]`): size, camera, and how often training
    /// films an evaluation episode.
    pub video: crate::video::VideoConfig,
    /// Experiment trackers (`[log] mlflow = URI`, `wandb = true`), beside
    /// `metrics.jsonl`.
    pub log: r2vpo_report::track::LogConfig,
    /// Checkpoint every this many env steps (0: only at the end and on
    /// SIGINT/SIGTERM). Default 320 000 = 10 × (1000-step episodes × 32
    /// envs), so an interrupted run loses at most ~10 minutes on 2 cores
    /// and no episode is cut. A checkpoint starts a new environment segment
    /// (see the module docs), so runs with different values differ.
    pub checkpoint_every: u64,
    /// DM Control suite folder override.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suite_dir: Option<PathBuf>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            flavour: Flavour::Cleanrl,
            task_gamma: Default::default(),
            reset_every_update: false,
            eval_deterministic: true,
            video: crate::video::VideoConfig::default(),
            log: r2vpo_report::track::LogConfig::default(),
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
            obs_norm_refresh: NormRefresh::BeforeEpochs,
            gae: GaeConfig { gamma: 0.99, lambda: 0.95 },
            objective: ObjectiveConfig::default(),
            dual: DualConfig::control_default(),
            policy: PolicyConfig::default(),
            eval_every: 100_000,
            eval_episodes: 10,
            checkpoint_every: 320_000,
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

    /// The GAE settings of this run's task: `gae` with `task_gamma`'s γ for
    /// the task where it names one.
    pub fn gae_for_task(&self) -> GaeConfig {
        let mut g = self.gae;
        if let Some(&gamma) = self.task_gamma.get(&self.task) {
            g.gamma = gamma;
        }
        g
    }

    /// Checks every field; errors name the field.
    pub fn validate(&self) -> TrainResult<()> {
        use r2vpo::objective::ObjectiveKind;
        self.video.validate()?;
        self.log.validate().map_err(|m| config_err("log", m))?;
        if self.video.every > 0 && self.eval_episodes == 0 {
            return Err(config_err(
                "video.every",
                "videos film evaluation episodes, and eval_episodes = 0 turns evaluation off".into(),
            ));
        }
        if matches!(self.objective.kind, ObjectiveKind::DppoTv | ObjectiveKind::DppoKl) {
            return Err(config_err(
                "objective.kind",
                format!(
                    "`{}` bounds how far the sampled token's probability moved; a continuous action has a density, \
                     not a probability (it can exceed 1), so DPPO's trust region means nothing here",
                    self.objective.kind.as_str()
                ),
            ));
        }
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
        if !segments.is_multiple_of(self.num_envs) {
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
        for (task, &gamma) in &self.task_gamma {
            crate::tasks::task_spec(task).map_err(|e| config_err("task_gamma", format!("{task}: {e}")))?;
            if !(gamma.is_finite() && (0.0..=1.0).contains(&gamma)) {
                return Err(config_err("task_gamma", format!("{task}: γ must lie in [0, 1], got {gamma}")));
            }
        }
        let tanh = self.policy.distribution == crate::policy::ActionDistribution::TanhNormal;
        if tanh && self.flavour != Flavour::Brax {
            return Err(config_err(
                "policy.distribution",
                "\"tanh-normal\" needs the sampled entropy of flavour = \"brax\"; the cleanrl flavour uses \"normal\""
                    .into(),
            ));
        }
        let brax_normaliser = self.flavour == Flavour::Brax && self.normalize_obs;
        if !(self.obs_norm_refresh.is_default() || brax_normaliser) {
            return Err(config_err(
                "obs_norm_refresh",
                "only the brax flavour's in-network normaliser has a refresh to move: it needs flavour = \"brax\" \
                 and normalize_obs = true"
                    .into(),
            ));
        }
        self.objective.validate()?;
        self.dual.validate()?;
        self.policy.validate()?;
        crate::tasks::task_spec(&self.task)?;
        Ok(())
    }

    pub(super) fn env_config(&self, num_envs: usize, seed: u64) -> VecEnvConfig {
        VecEnvConfig {
            task: self.task.clone(),
            num_envs,
            seed,
            // Brax normalises inside the networks (crate::brax::ObsNormalizer).
            normalize_obs: self.normalize_obs && self.flavour == Flavour::Cleanrl,
            obs_clip: self.obs_clip,
            reward_scale: self.reward_scale,
            suite_dir: self.suite_dir.clone(),
        }
    }
}

/// The `--set`-style overrides of a named algorithm from the core's table
/// ([`r2vpo::algo::ALGORITHMS`]): `ppo` (clipping, no dual-clip), `r2vpo`,
/// and every other on-policy name; replay algorithms are refused, since this
/// trainer has no replay buffer. The objective's own keys only: the config's
/// ε, λ and the rest stay.
pub fn algo_overrides(name: &str) -> TrainResult<Vec<String>> {
    let a = r2vpo::algo::find(name)?;
    a.require_on_policy("control")?;
    let sets = a.overrides(false);
    // DPPO is refused by validate(), with the reason; say it here too so
    // `--algo dppo-tv` fails before any config is read.
    let mut probe = TrainConfig::default();
    a.objective.apply(&mut probe.objective);
    probe.validate()?;
    Ok(sets)
}

/// The control commands' config file when `--config` is not given, where it
/// exists (it matches [`TrainConfig::default`]).
pub const DEFAULT_CONFIG: &str = "configs/control/cpu.toml";

/// `explicit`, else [`DEFAULT_CONFIG`] where it exists (relative to the
/// working directory), else none (the built-in defaults).
pub fn default_config(explicit: Option<&std::path::Path>) -> Option<std::path::PathBuf> {
    explicit
        .map(std::path::Path::to_path_buf)
        .or_else(|| Some(std::path::PathBuf::from(DEFAULT_CONFIG)).filter(|p| p.exists()))
}
