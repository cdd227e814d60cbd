//! Randomised resets of every task: valid, finite, seeded, contact-free where
//! dm_control requires it.

use r2vpo_control::{make_env, task_names};

#[test]
fn every_task_resets_and_steps() {
    for name in task_names() {
        let mut env = make_env(name, 3, None).unwrap();
        let mut again = make_env(name, 3, None).unwrap();
        for episode in 0..3 {
            let obs = env.reset().unwrap();
            assert_eq!(obs, again.reset().unwrap(), "{name}: same seed, same reset");
            assert_eq!(obs.len(), env.observation_dim(), "{name}");
            assert!(obs.iter().all(|x| x.is_finite()), "{name}: {obs:?}");
            assert_eq!(env.physics().data().time(), 0.0, "{name}");
            if ["ball_in_cup", "finger", "humanoid"].iter().any(|d| name.starts_with(d)) {
                assert_eq!(env.physics().ncon(), 0, "{name}: episode {episode} starts in contact");
            }
            let zero = vec![0.0; env.action_dim()];
            for _ in 0..5 {
                let (obs, r) = env.step(&zero);
                assert!(r.warning.is_none(), "{name}");
                assert!((0.0..=1.0).contains(&r.reward), "{name}: reward {}", r.reward);
                assert!(obs.iter().all(|x| x.is_finite()), "{name}");
            }
        }
    }
}

#[test]
fn reacher_targets_follow_dm_control_distribution() {
    let mut env = make_env("reacher-hard", 1, None).unwrap();
    for _ in 0..50 {
        env.reset().unwrap();
        let p = env.task().episode_params();
        let r = (p[0] * p[0] + p[1] * p[1]).sqrt();
        assert!((0.05..=0.2).contains(&r), "target radius {r}");
    }
}
