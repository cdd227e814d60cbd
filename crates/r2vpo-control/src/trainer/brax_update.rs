//! Update phase of the brax flavour: the rollout cut into `unroll`-step
//! sequences, the normaliser updated on the rollout, then `epochs` passes
//! of freshly permuted minibatches of whole sequences through Brax's loss
//! ([`crate::brax::loss_and_grads`]), which recomputes values and
//! advantages with the current critic (Brax `train.py`: `training_step`,
//! `sgd_step`, `minibatch_step`).

use super::update::StepMeans;
use super::*;
use crate::brax::{loss_and_grads, LossConfig, Minibatch};

/// One minibatch's gathered rows, reused across steps.
#[derive(Default)]
pub(super) struct Gathered {
    pub(super) obs: Vec<f32>,
    pub(super) bootstrap_obs: Vec<f32>,
    pub(super) actions: Vec<f32>,
    pub(super) logp: Vec<f32>,
    pub(super) rewards: Vec<f32>,
    pub(super) truncation: Vec<bool>,
    pub(super) termination: Vec<bool>,
    pub(super) noise: Vec<f32>,
}

impl Trainer {
    /// One brax-flavour update (see the module docs); metrics as
    /// [`Trainer::update`].
    pub(super) fn update_brax(&mut self) -> TrainResult<UpdateMetrics> {
        let t0 = Instant::now();
        let episodes = self.rollout()?;
        let rollout_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        // Brax updates the normaliser on the rollout's observations before
        // the epochs, so the first minibatch's ratios are not exactly 1
        // (`obs_norm_refresh` moves it or re-anchors the ratios).
        let refresh = self.cfg.obs_norm_refresh;
        if refresh != NormRefresh::AfterEpochs {
            self.refresh_obs_norm();
        }
        if refresh == NormRefresh::Recompute && self.obs_norm.is_some() {
            self.recompute_behaviour_logp();
        }
        let (n, d, a) = (self.cfg.num_envs, self.net.obs_dim(), self.net.act_dim());
        let (unroll, b) = (self.cfg.unroll, self.cfg.batch_size);
        let t_len = self.cfg.rollout_len();
        let chunks = t_len / unroll;
        // Sequence s = k·N + e is steps k·unroll .. (k+1)·unroll of env e
        // (Brax's reshape of its (chunks, envs, unroll) data).
        let sequences = chunks * n;
        let gae = self.cfg.gae_for_task();
        let loss_cfg = LossConfig {
            gamma: gae.gamma,
            gae_lambda: gae.lambda,
            entropy_cost: self.cfg.entropy_cost,
            value_coef: self.cfg.value_coef,
            normalize_advantage: self.cfg.normalize_advantage,
        };
        let schedule = EpochSchedule {
            epochs: self.cfg.epochs,
            minibatch_size: b,
            remainder: Remainder::Drop,
            reshuffle: Reshuffle::FromIdentity,
        };
        let update_index = self.counters.update + 1;
        let mut grads = self.fast.zero_grads();
        let mut g = Gathered::default();
        let mut stats: Vec<RatioStats> = Vec::new();
        let (mut ent_sum, mut vl_sum, mut gn_sum, mut pl_sum, mut sigma_sum, mut ev_sum) =
            (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        let mut first_dev = 0.0;
        let mut steps = 0usize;
        for (k, step) in schedule.steps(sequences, &mut self.rng).iter().enumerate() {
            self.gather(&step.indices, &mut g, (n, d, a), unroll);
            g.noise.clear();
            g.noise.extend((0..unroll * b * a).map(|_| -> f32 { StandardNormal.sample(&mut self.rng) }));
            grads.iter_mut().for_each(|x| x.fill(0.0));
            let mb = Minibatch {
                unroll,
                seqs: b,
                obs: &g.obs,
                bootstrap_obs: &g.bootstrap_obs,
                actions: &g.actions,
                behaviour_logp: &g.logp,
                rewards: &g.rewards,
                truncation: &g.truncation,
                termination: &g.termination,
                entropy_noise: &g.noise,
            };
            let terms = loss_and_grads(&self.fast, &self.learner, &mb, &loss_cfg, &mut grads)?;
            if !terms.total.is_finite() {
                return Err(TrainError::Diverged { update: update_index, what: format!("loss = {}", terms.total) });
            }
            let gn = self.adam.step_flat(&mut self.fast.params_mut(), &grads, self.cfg.max_grad_norm);
            if !gn.is_finite() {
                return Err(TrainError::Diverged { update: update_index, what: format!("gradient norm = {gn}") });
            }
            self.learner.after_step(std::slice::from_ref(&terms.stats))?;
            if k == 0 {
                first_dev = (terms.stats.ratio_max - 1.0).abs().max((terms.stats.ratio_min - 1.0).abs());
            }
            ent_sum += terms.entropy;
            vl_sum += terms.value_loss;
            pl_sum += terms.policy_loss;
            ev_sum += terms.explained_variance;
            sigma_sum += terms.sigma_mean;
            gn_sum += gn;
            stats.push(terms.stats);
            steps += 1;
        }
        if refresh == NormRefresh::AfterEpochs {
            self.refresh_obs_norm();
        }
        self.fast.write_to(&self.net)?;
        let learn_s = t1.elapsed().as_secs_f64();
        let k = steps.max(1) as f64;
        let means = StepMeans {
            entropy: ent_sum / k,
            sigma: sigma_sum / k,
            policy_loss: pl_sum / k,
            value_loss: vl_sum / k,
            grad_norm: gn_sum / k,
            explained_variance: ev_sum / k,
        };
        let new_steps = (t_len * n) as u64;
        Ok(self.close_update(update_index, &episodes, &stats, first_dev, means, new_steps, (rollout_s, learn_s)))
    }

    /// Folds the rollout's observations into the normaliser the networks
    /// use.
    fn refresh_obs_norm(&mut self) {
        if let Some(norm) = &mut self.obs_norm {
            norm.update(&self.buf.obs);
            self.fast.set_obs_norm(Some(norm.mean_std()));
        }
    }

    /// Replaces every stored behaviour log-prob by the current networks'
    /// under the current normaliser (`obs_norm_refresh = "recompute"`), in
    /// chunks so that a 2048-env rollout (983,040 rows) does not hold every
    /// row's activations at once.
    fn recompute_behaviour_logp(&mut self) {
        const CHUNK: usize = 8192;
        let (d, a) = (self.net.obs_dim(), self.net.act_dim());
        let rows = self.buf.logp.len();
        for start in (0..rows).step_by(CHUNK) {
            let end = (start + CHUNK).min(rows);
            let f = self.fast.forward(&self.buf.obs[start * d..end * d], end - start);
            let logp = self.fast.log_prob(&f, &self.buf.actions[start * a..end * a]);
            self.buf.logp[start..end].copy_from_slice(&logp);
        }
    }

    /// Gathers the sequences `seqs` of the rollout into `g`, time-major.
    pub(super) fn gather(&self, seqs: &[usize], g: &mut Gathered, (n, d, a): (usize, usize, usize), unroll: usize) {
        let buf = &self.buf;
        let t_len = buf.logp.len() / n;
        let b = seqs.len();
        g.obs.clear();
        g.bootstrap_obs.clear();
        g.actions.clear();
        g.logp.clear();
        g.rewards.clear();
        g.truncation.clear();
        g.termination.clear();
        for tau in 0..unroll {
            for &s in seqs {
                let (chunk, e) = (s / n, s % n);
                let i = (chunk * unroll + tau) * n + e;
                g.obs.extend_from_slice(&buf.obs[i * d..(i + 1) * d]);
                g.actions.extend_from_slice(&buf.actions[i * a..(i + 1) * a]);
                g.logp.push(buf.logp[i]);
                g.rewards.push(buf.rewards[i]);
                g.truncation.push(buf.truncated[i]);
                // A step that ends an episode both ways is a truncation
                // (Brax: termination = (1 − discount)·(1 − truncation)).
                g.termination.push(buf.terminated[i] && !buf.truncated[i]);
            }
        }
        for &s in seqs {
            let (chunk, e) = (s / n, s % n);
            let next = (chunk + 1) * unroll;
            if next < t_len {
                let i = next * n + e;
                g.bootstrap_obs.extend_from_slice(&buf.obs[i * d..(i + 1) * d]);
            } else {
                g.bootstrap_obs.extend_from_slice(&self.obs[e * d..(e + 1) * d]);
            }
        }
        debug_assert_eq!(g.logp.len(), unroll * b);
    }
}
