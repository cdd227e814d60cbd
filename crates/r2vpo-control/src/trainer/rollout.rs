//! Rollout phase: every environment steps `rollout_len` times under the
//! current policy into flat, time-major buffers.

use super::*;

/// Reusable rollout buffers (time-major: step `t` of env `n` at `t·N + n`).
#[derive(Debug, Default)]
pub(super) struct Rollout {
    pub(super) obs: Vec<f32>,
    pub(super) actions: Vec<f32>,
    pub(super) logp: Vec<f32>,
    pub(super) values: Vec<f32>,
    pub(super) rewards: Vec<f32>,
    pub(super) truncated: Vec<bool>,
    pub(super) terminated: Vec<bool>,
    /// V(final_obs) at truncated steps (cleanrl flavour).
    pub(super) final_values: Vec<f32>,
}

impl Trainer {
    /// Collects one rollout into the buffers; returns the finished episodes.
    pub(super) fn rollout(&mut self) -> TrainResult<Vec<EpisodeStats>> {
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
            for (i, (act, env_act)) in actions.iter_mut().zip(env_actions.iter_mut()).enumerate() {
                let eps: f32 = StandardNormal.sample(&mut self.rng);
                // The stored action is the unclipped (pre-tanh) sample; the
                // environment gets clip(u) or tanh(u).
                *act = f.mean[i] + self.fast.sigma(&f, i / a, i % a) * eps;
                *env_act = self.fast.env_action(*act);
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
            // Only the cleanrl flavour bootstraps a truncated step.
            if !final_rows.is_empty() && self.cfg.flavour == Flavour::Cleanrl {
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
    pub(super) fn next_values(&self) -> TrainResult<Vec<f32>> {
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
}
