use super::*;
use r2vpo::objective::ObjectiveKind;
use std::sync::atomic::AtomicBool;

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

/// σ stays within `[min_log_std, max_log_std]` in both modes whatever
/// drives it: here an entropy bonus with nothing to oppose it (a learning
/// rate far above the policy's own signal). A state-independent σ once grew
/// without bound (cheetah-run entropy 8.4 → 52.5).
#[test]
fn the_log_std_bounds_hold_in_every_mode() {
    for mode in [crate::policy::LogStdMode::StateIndependent, crate::policy::LogStdMode::StateDependent] {
        let mut cfg = tiny("cartpole-balance");
        cfg.policy.log_std = mode;
        cfg.policy.max_log_std = 0.5;
        cfg.entropy_cost = 100.0;
        cfg.lr = 0.05;
        cfg.total_env_steps = 4 * 16 * 6;
        let mut t = Trainer::new(cfg).unwrap();
        let mut last = 0.0;
        for _ in 0..6 {
            last = t.update().unwrap().entropy;
        }
        // The Gaussian's entropy per dimension at σ = e^0.5 (cartpole: one action).
        let bound = 0.5 + 0.5 * (1.0 + (2.0 * std::f64::consts::PI).ln());
        assert!(last <= bound + 1e-4, "{mode:?}: entropy {last} above the bound {bound}");
        assert!(last > bound - 0.05, "{mode:?}: entropy {last}: the bonus did not reach the bound");
        let obs = Tensor::zeros((1, t.net.obs_dim()), DType::F32, &Device::Cpu).unwrap();
        let ls = t.net.dist(&obs).unwrap().log_std.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(ls.iter().all(|&x| x <= 0.5 + 1e-6), "{mode:?}: {ls:?}");
    }
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
    let (adv, _) = gae(&t.buf.rewards, &t.buf.values, &next, &t.buf.terminated, &t.buf.truncated, n, &gcfg).unwrap();
    // Truncated: δ = r + γ·V(final) − V, no trace across the reset.
    assert!((adv[1] - (1.0 + 0.5 * 100.0 - 1.0)).abs() < 1e-4);
    // Unstable: δ = r − V, no bootstrap at all.
    assert!((adv[n + 2] - (1.0 - 6.0)).abs() < 1e-4);
}

#[test]
fn real_truncation_records_final_values() {
    // cartpole episodes are 1000 steps: 4 envs × 1000 steps exactly.
    let cfg =
        TrainConfig { total_env_steps: 4000, unroll: 125, batch_size: 4, minibatches: 1, ..tiny("cartpole-balance") };
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

/// The brax flavour on a tiny problem: tanh-normal, sequences of 8 steps,
/// environments reset after every update, sampled evaluation, a per-task γ.
fn brax_tiny(task: &str) -> TrainConfig {
    let mut cfg = tiny(task);
    cfg.flavour = Flavour::Brax;
    cfg.policy.distribution = crate::policy::ActionDistribution::TanhNormal;
    cfg.policy.log_std = crate::policy::LogStdMode::StateDependent;
    cfg.policy.activation = crate::policy::Activation::Silu;
    cfg.policy.init = crate::policy::Init::LecunUniform;
    cfg.reset_every_update = true;
    cfg.eval_deterministic = false;
    cfg.entropy_cost = 1e-2;
    cfg.task_gamma.insert(task.into(), 0.95);
    cfg
}

#[test]
fn resume_repeats_the_uninterrupted_run() {
    resume_repeats(tiny("cartpole-balance"));
}

#[test]
fn a_brax_flavour_resume_repeats_the_uninterrupted_run() {
    resume_repeats(brax_tiny("cartpole-balance"));
}

fn resume_repeats(base: TrainConfig) {
    let dir = tempfile::tempdir().unwrap();
    let per_update = 4 * 16;
    let cfg = TrainConfig {
        total_env_steps: 6 * per_update,
        checkpoint_every: 3 * per_update,
        eval_every: 3 * per_update,
        eval_episodes: 2,
        objective: ObjectiveConfig { kind: ObjectiveKind::R2vpo, ..ObjectiveConfig::default() },
        ..base
    };
    let a_dir = dir.path().join("a");
    let full = Trainer::new(cfg.clone()).unwrap().run(Some(&a_dir), None, &AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(full.len(), 6);
    let b_dir = dir.path().join("b");
    let first = Trainer::new(TrainConfig { total_env_steps: 3 * per_update, ..cfg.clone() })
        .unwrap()
        .run(Some(&b_dir), None, &AtomicBool::new(false), |_| {})
        .unwrap();
    let mut resumed = Trainer::resume(&b_dir, Some(cfg.clone())).unwrap();
    assert_eq!(resumed.counters().update, 3);
    let rest = resumed.run(Some(&b_dir), None, &AtomicBool::new(false), |_| {}).unwrap();
    let joined: Vec<_> = first.iter().chain(&rest).map(UpdateMetrics::without_timing).collect();
    let full: Vec<_> = full.iter().map(UpdateMetrics::without_timing).collect();
    assert_eq!(joined, full);
    assert!(full[2].eval_return_mean.is_some() && full[5].eval_return_mean.is_some());
    // The policy loads back for evaluation.
    let saved = load_policy(&b_dir).unwrap();
    assert_eq!(saved.obs_norm.is_some(), cfg.flavour == Flavour::Brax);
    let r = evaluate_policy(&saved.config, &saved.eval_policy(), 2, 9).unwrap();
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
    let log = t.run(None, None, &AtomicBool::new(false), |_| {}).unwrap();
    let rounds: Vec<f64> = log.iter().filter_map(|m| m.episode_return_mean).collect();
    eprintln!("per-round returns: {rounds:?}");
    assert!(rounds.len() >= 4, "{rounds:?}");
    let later = rounds[2..].iter().sum::<f64>() / (rounds.len() - 2) as f64;
    assert!(later > rounds[0] + 50.0, "return did not increase: {rounds:?}");
}

#[test]
fn the_brax_flavour_learns_from_whole_sequences_and_resets_each_update() {
    let mut t = Trainer::new(brax_tiny("cheetah-run")).unwrap();
    t.rollout().unwrap();
    // Sequence s = k·N + e of the rollout: its rows are env e's steps k·8 ..
    // k·8 + 7 in order, and its bootstrap is the next step's observation.
    let (n, d, unroll) = (4, t.net.obs_dim(), 8);
    let mut g = brax_update::Gathered::default();
    // Two chunks of 8 steps per env (16-step rollout).
    t.gather(&[1, 6], &mut g, (n, d, t.net.act_dim()), unroll);
    for tau in 0..unroll {
        let i = tau * n + 1; // sequence 1: chunk 0, env 1
        assert_eq!(&g.obs[(tau * 2) * d..(tau * 2 + 1) * d], &t.buf.obs[i * d..(i + 1) * d]);
        assert_eq!(g.logp[tau * 2], t.buf.logp[i]);
        let j = (unroll + tau) * n + 2; // sequence 6: chunk 1, env 2
        assert_eq!(g.logp[tau * 2 + 1], t.buf.logp[j]);
    }
    let next = unroll * n + 1;
    assert_eq!(&g.bootstrap_obs[..d], &t.buf.obs[next * d..(next + 1) * d]);
    // Sequence 6 is the rollout's last chunk of env 2: it bootstraps from
    // the observation after the rollout.
    assert_eq!(&g.bootstrap_obs[d..2 * d], &t.obs[2 * d..3 * d]);
    // The stored actions are pre-tanh samples: the environment got tanh(u).
    assert!(t.buf.actions.iter().any(|u| u.abs() > 1.0));

    // Through `run`: every update is a segment, and the normaliser moved.
    let mut t = Trainer::new(brax_tiny("cheetah-run")).unwrap();
    let ms = t.run(None, None, &AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(ms.len(), 3);
    assert_eq!(t.counters().segment, 3);
    let norm = t.obs_normalizer().unwrap();
    assert_eq!(norm.count, 3 * 4 * 16);
    assert!(norm.std.iter().any(|&s| s != 1.0));
    for m in &ms {
        assert!(m.entropy.is_finite() && m.sigma_mean.unwrap() > 0.0, "{m:?}");
    }
    // The normaliser updates before the epochs: the first minibatch's
    // ratios are not all 1 (Brax's behaviour, module docs).
    assert!(ms[1].first_minibatch_ratio_dev > 0.0);
}

#[test]
fn flavour_settings_are_checked() {
    let mut cfg = tiny("cheetah-run");
    cfg.policy.distribution = crate::policy::ActionDistribution::TanhNormal;
    cfg.policy.log_std = crate::policy::LogStdMode::StateDependent;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("policy.distribution") && e.contains("brax"), "{e}");
    let mut cfg = brax_tiny("cheetah-run");
    cfg.policy.log_std = crate::policy::LogStdMode::StateIndependent;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("policy.log_std"), "{e}");
    let mut cfg = tiny("cheetah-run");
    cfg.task_gamma.insert("cheetah-sprint".into(), 0.9);
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("task_gamma") && e.contains("cheetah-sprint"), "{e}");
    let mut cfg = tiny("cheetah-run");
    cfg.task_gamma.insert("cheetah-run".into(), 1.5);
    assert!(cfg.validate().unwrap_err().to_string().contains("task_gamma"));
    cfg.task_gamma.insert("cheetah-run".into(), 0.9);
    assert_eq!(cfg.gae_for_task().gamma, 0.9);
    cfg.task = "cartpole-balance".into();
    assert_eq!(cfg.gae_for_task().gamma, cfg.gae.gamma);
}

/// `obs_norm_refresh`: both alternatives to Brax's order start the epochs
/// at ρ = 1 exactly (Brax's does not, above); "recompute" refreshes the
/// normaliser as Brax does, "after-epochs" one update later; a resume
/// repeats the uninterrupted run; the option is refused where there is no
/// in-network normaliser.
#[test]
fn a_moved_or_re_anchored_normaliser_refresh_starts_the_epochs_at_ratio_one() {
    let brax = {
        let mut t = Trainer::new(brax_tiny("cheetah-run")).unwrap();
        (0..2).map(|_| t.update().unwrap()).collect::<Vec<_>>()
    };
    assert!(brax[1].first_minibatch_ratio_dev > 0.0);
    for refresh in [NormRefresh::Recompute, NormRefresh::AfterEpochs] {
        let mut cfg = brax_tiny("cheetah-run");
        cfg.objective.kind = ObjectiveKind::R2vpo;
        cfg.obs_norm_refresh = refresh;
        cfg.validate().unwrap();
        let mut t = Trainer::new(cfg.clone()).unwrap();
        for u in 1..=2u64 {
            let m = t.update().unwrap();
            assert_eq!(m.first_minibatch_ratio_dev, 0.0, "{refresh:?}, update {u}: {m:?}");
            assert!(m.ratio_var > 0.0, "{refresh:?}: {m:?}");
            // Both fold every rollout in; they differ in when the epochs
            // see it.
            assert_eq!(t.obs_normalizer().unwrap().count, u * 4 * 16, "{refresh:?}");
        }
        resume_repeats(cfg);
    }
    let mut cfg = tiny("cheetah-run");
    cfg.obs_norm_refresh = NormRefresh::Recompute;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("obs_norm_refresh") && e.contains("brax"), "{e}");
}
