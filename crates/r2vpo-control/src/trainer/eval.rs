//! Evaluation: whole episodes of fresh environments under the current
//! policy, its mode (deterministic) or samples from it.

use super::*;

/// What [`evaluate_policy`] needs besides the config: the networks and the
/// observation statistics they were trained with.
#[derive(Debug)]
pub struct EvalPolicy<'a> {
    /// The networks.
    pub net: &'a ActorCritic,
    /// The environments' observation statistics (cleanrl flavour).
    pub obs_stats: &'a RunningMeanStd,
    /// Brax's in-network normaliser (brax flavour).
    pub obs_norm: Option<&'a ObsNormalizer>,
}

impl Trainer {
    /// Evaluation over `episodes` complete episodes of fresh environments
    /// seeded from `(seed, index)`, with the training observation
    /// statistics frozen; the policy's mode or its samples as
    /// `eval_deterministic` says. Returns the undiscounted returns.
    pub fn evaluate(&self, episodes: usize, index: u64) -> TrainResult<Vec<f64>> {
        evaluate_policy(
            &self.cfg,
            &EvalPolicy { net: &self.net, obs_stats: self.env.obs_stats(), obs_norm: self.obs_norm.as_ref() },
            episodes,
            derived_seed(self.cfg.seed, TAG_EVAL, index),
        )
    }

    /// [`Trainer::evaluate`] that films the first episode into `target`;
    /// the returns are the unfilmed evaluation's.
    pub fn evaluate_filmed(
        &self,
        episodes: usize,
        index: u64,
        target: VideoTarget,
    ) -> TrainResult<(Vec<f64>, Vec<VideoFile>)> {
        evaluate_policy_recorded(
            &self.cfg,
            &EvalPolicy { net: &self.net, obs_stats: self.env.obs_stats(), obs_norm: self.obs_norm.as_ref() },
            episodes,
            derived_seed(self.cfg.seed, TAG_EVAL, index),
            vec![target],
        )
    }
}

/// Evaluation of `policy` (see [`Trainer::evaluate`]) on environments
/// seeded with `seed`, one episode per environment (Brax's evaluator runs
/// `num_eval_envs` environments for one episode each in the same way).
/// Sampled actions draw from a stream derived from `seed`.
pub fn evaluate_policy(cfg: &TrainConfig, policy: &EvalPolicy, episodes: usize, seed: u64) -> TrainResult<Vec<f64>> {
    Ok(evaluate_policy_recorded(cfg, policy, episodes, seed, Vec::new())?.0)
}

/// [`evaluate_policy`] that also films the first episode of the first
/// `videos.len()` environments (one [`VideoTarget`] each, `cfg.video`'s
/// size and camera). Returns the returns, which recording leaves as they
/// are, and the videos written.
pub fn evaluate_policy_recorded(
    cfg: &TrainConfig,
    policy: &EvalPolicy,
    episodes: usize,
    seed: u64,
    videos: Vec<VideoTarget>,
) -> TrainResult<(Vec<f64>, Vec<VideoFile>)> {
    if episodes == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    if videos.len() > episodes {
        return Err(config_err(
            "video episodes",
            format!("{} videos asked of an evaluation of {episodes} episodes", videos.len()),
        ));
    }
    let env_cfg = cfg.env_config(episodes, seed);
    let mut recorder = if videos.is_empty() {
        None
    } else {
        let model = crate::load_task_model(crate::task_spec(&cfg.task)?, env_cfg.suite_dir.as_deref())?;
        let probe = crate::Env::with_model(crate::task_spec(&cfg.task)?, Arc::clone(&model), 0)?;
        let dt = probe.physics().control_timestep();
        Some(Recorder::new(&cfg.video, model, dt, probe.episode_steps(), videos)?)
    };
    let mut env = VecEnv::new(env_cfg)?;
    env.set_update_stats(false);
    env.set_obs_stats(policy.obs_stats.clone())?;
    let mut net = NativeNet::from_net(policy.net)?;
    net.set_obs_norm(policy.obs_norm.map(ObsNormalizer::mean_std));
    let a = env.action_dim();
    let mut rng = ChaCha8Rng::seed_from_u64(derived_seed(seed, TAG_SAMPLING, 0));
    let mut obs: Vec<f32> = env.reset()?.iter().map(|&x| x as f32).collect();
    if let Some(rec) = recorder.as_mut() {
        for i in 0..rec.len() {
            rec.frame(i, env.env(i))?;
        }
    }
    let mut returns: Vec<Option<f64>> = vec![None; episodes];
    let mut actions = vec![0f64; episodes * a];
    // Unstable episodes restart; give up after a generous number of steps.
    let limit = 20 * env.episode_steps();
    for _ in 0..limit {
        let f = net.infer(&obs, episodes);
        for (i, x) in actions.iter_mut().enumerate() {
            let u = if cfg.eval_deterministic {
                f.mean[i]
            } else {
                let eps: f32 = StandardNormal.sample(&mut rng);
                f.mean[i] + net.sigma(&f, i / a, i % a) * eps
            };
            *x = net.env_action(u);
        }
        let step = env.step(&actions)?;
        for (o, &x) in obs.iter_mut().zip(&step.obs) {
            *o = x as f32;
        }
        for e in env.drain_finished() {
            if !e.unstable && returns[e.env].is_none() {
                returns[e.env] = Some(e.ret);
            }
            // A video holds one episode: the environment has been reset.
            if let Some(rec) = recorder.as_mut() {
                rec.finish(e.env)?;
            }
        }
        if let Some(rec) = recorder.as_mut() {
            for i in 0..rec.len() {
                rec.frame(i, env.env(i))?;
            }
        }
        if returns.iter().all(Option::is_some) {
            break;
        }
    }
    let files = match recorder {
        Some(rec) => rec.close()?,
        None => Vec::new(),
    };
    Ok((returns.into_iter().flatten().collect(), files))
}
