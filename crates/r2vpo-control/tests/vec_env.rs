//! Vectorised environment: determinism across thread counts, auto-reset with
//! final observations, and warning resets.

use r2vpo_control::{VecEnv, VecEnvConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Trace {
    obs: Vec<Vec<f64>>,
    rewards: Vec<f64>,
    finals: Vec<f64>,
    episodes: usize,
}

fn run(threads: usize, seed: u64, steps: usize) -> Trace {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    pool.install(|| {
        let mut cfg = VecEnvConfig::new("cartpole-swingup", 6, seed);
        cfg.reward_scale = 10.0;
        let mut venv = VecEnv::new(cfg).unwrap();
        let mut act_rng = ChaCha8Rng::seed_from_u64(99);
        let mut trace =
            Trace { obs: vec![venv.reset().unwrap().to_vec()], rewards: vec![], finals: vec![], episodes: 0 };
        let episode_steps = venv.episode_steps();
        for t in 0..steps {
            let actions: Vec<f64> = (0..6).map(|_| act_rng.random_range(-1.0..1.0)).collect();
            let s = venv.step(&actions).unwrap();
            assert!(s.unstable.iter().all(|&u| !u));
            for (r, raw) in s.rewards.iter().zip(&s.raw_rewards) {
                assert!((r - 10.0 * raw).abs() < 1e-12);
            }
            let any_trunc = s.truncated.iter().any(|&x| x);
            assert_eq!(any_trunc, t + 1 == episode_steps, "truncation only at step 1000");
            if any_trunc {
                assert!(s.truncated.iter().all(|&x| x));
                trace.finals.extend(&s.final_obs);
                assert!(s.final_obs.iter().any(|&x| x != 0.0));
            }
            trace.obs.push(s.obs.clone());
            trace.rewards.extend(&s.rewards);
            trace.episodes += venv.drain_finished().len();
        }
        trace
    })
}

#[test]
fn deterministic_for_seed_and_thread_count() {
    let steps = 1010;
    let a = run(1, 5, steps);
    let b = run(2, 5, steps);
    assert_eq!(a.obs, b.obs);
    assert_eq!(a.rewards, b.rewards);
    assert_eq!(a.finals, b.finals);
    assert_eq!(a.episodes, 6);
    let c = run(2, 6, 20);
    assert_ne!(a.obs[1], c.obs[1], "another seed gives other initial states");
}

#[test]
fn warnings_reset_the_env_and_are_counted() {
    let mut venv = VecEnv::new(VecEnvConfig::new("cheetah-run", 2, 0)).unwrap();
    venv.reset().unwrap();
    let mut actions = vec![0.0; 12];
    actions[0] = f64::NAN; // MuJoCo flags a bad control (mjWARN_BADCTRL).
    let s = venv.step(&actions).unwrap();
    assert_eq!(s.unstable, vec![true, false]);
    assert!(s.obs.iter().all(|x| x.is_finite()));
    assert_eq!(venv.warning_resets(), 1);
    let fin = venv.drain_finished();
    assert_eq!(fin.len(), 1);
    assert!(fin[0].unstable && fin[0].env == 0 && fin[0].length == 1);
    let s = venv.step(&[0.0; 12]).unwrap();
    assert_eq!(s.unstable, vec![false, false]);
}
