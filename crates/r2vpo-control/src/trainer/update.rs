//! Update phase: GAE over the rollout, then epochs × minibatches of the
//! objective through the core's learner contract.

use super::*;

impl Trainer {
    /// One update: rollout, GAE, epochs × minibatches. Does not evaluate or
    /// checkpoint (see [`Trainer::run`]).
    pub fn update(&mut self) -> TrainResult<UpdateMetrics> {
        if self.cfg.flavour == Flavour::Brax {
            return self.update_brax();
        }
        let t0 = Instant::now();
        let episodes = self.rollout()?;
        let rollout_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let (n, d, a) = (self.cfg.num_envs, self.net.obs_dim(), self.net.act_dim());
        let next_values = self.next_values()?;
        let b = &self.buf;
        let (adv, ret) =
            gae(&b.rewards, &b.values, &next_values, &b.terminated, &b.truncated, n, &self.cfg.gae_for_task())?;
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
        let mut stats: Vec<RatioStats> = Vec::new();
        let (mut ent_sum, mut vl_sum, mut gn_sum, mut pl_sum, mut sigma_sum) = (0.0, 0.0, 0.0, 0.0, 0.0);
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
        // Brax's schedule: every epoch reshuffles the previous order, and a
        // short last minibatch is dropped (the sizes divide evenly anyway).
        let schedule = EpochSchedule {
            epochs: self.cfg.epochs,
            minibatch_size: mb,
            remainder: Remainder::Drop,
            reshuffle: Reshuffle::Continue,
        };
        for (k, step) in schedule.steps(total, &mut self.rng).iter().enumerate() {
            {
                let idx = &step.indices;
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
                let out = self.learner.loss(
                    &PolicyBatch {
                        logp: logp.as_tensor(),
                        old_logp: &old_t,
                        advantages: &adv_t,
                        mask: &mask,
                        weights: None,
                    },
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
                self.fast.project_log_std();
                if !gn.is_finite() {
                    return Err(TrainError::Diverged { update: update_index, what: format!("gradient norm = {gn}") });
                }
                self.learner.after_step(std::slice::from_ref(&out.stats))?;
                if k == 0 {
                    first_dev = (out.stats.ratio_max - 1.0).abs().max((out.stats.ratio_min - 1.0).abs());
                }
                ent_sum += entropy;
                sigma_sum += self.fast.mean_sigma(&f);
                vl_sum += value_loss;
                pl_sum += out.stats.pg_loss + out.stats.penalty;
                gn_sum += gn;
                stats.push(out.stats);
                steps += 1;
            }
        }
        self.fast.write_to(&self.net)?;
        let learn_s = t1.elapsed().as_secs_f64();
        let k = steps.max(1) as f64;
        let sums = StepMeans {
            entropy: ent_sum / k,
            sigma: sigma_sum / k,
            policy_loss: pl_sum / k,
            value_loss: vl_sum / k,
            grad_norm: gn_sum / k,
            explained_variance,
        };
        Ok(self.close_update(update_index, &episodes, &stats, first_dev, sums, total as u64, (rollout_s, learn_s)))
    }
}

/// Per-SGD-step means of an update, for its metrics.
pub(super) struct StepMeans {
    pub(super) entropy: f64,
    pub(super) sigma: f64,
    pub(super) policy_loss: f64,
    pub(super) value_loss: f64,
    pub(super) grad_norm: f64,
    pub(super) explained_variance: f64,
}

impl Trainer {
    /// Counts an update's env steps and episodes and makes its metrics
    /// (both flavours).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn close_update(
        &mut self,
        update_index: u64,
        episodes: &[EpisodeStats],
        stats: &[RatioStats],
        first_dev: f64,
        means: StepMeans,
        new_steps: u64,
        (rollout_s, learn_s): (f64, f64),
    ) -> UpdateMetrics {
        let s = RatioStats::merge(stats);
        self.counters.update = update_index;
        self.counters.env_steps += new_steps;
        self.counters.episodes += episodes.len() as u64;
        self.counters.warning_resets += episodes.iter().filter(|e| e.unstable).count() as u64;
        let full: Vec<f64> = episodes.iter().filter(|e| !e.unstable).map(|e| e.ret).collect();
        let (rm, rs) = mean_std(&full);
        UpdateMetrics {
            update: update_index,
            env_steps: self.counters.env_steps,
            episodes: full.len(),
            episode_return_mean: (!full.is_empty()).then_some(rm),
            episode_return_std: (!full.is_empty()).then_some(rs),
            ratio_mean: s.ratio_mean,
            ratio_var: s.ratio_var,
            sq_dev: s.sq_dev_mean,
            first_minibatch_ratio_dev: first_dev,
            lambda: self.learner.lambda(),
            clip_frac: s.clip_frac_low + s.clip_frac_high,
            approx_kl: s.approx_kl,
            entropy: means.entropy,
            sigma_mean: Some(means.sigma),
            policy_loss: means.policy_loss,
            value_loss: means.value_loss,
            grad_norm: means.grad_norm,
            explained_variance: means.explained_variance,
            warning_resets: self.counters.warning_resets,
            env_steps_per_s: new_steps as f64 / (rollout_s + learn_s).max(1e-9),
            rollout_s,
            learn_s,
            eval_return_mean: None,
            eval_return_std: None,
            video: None,
        }
    }
}
