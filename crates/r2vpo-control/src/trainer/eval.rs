//! Deterministic evaluation of the mean action.

use super::*;

impl Trainer {
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
