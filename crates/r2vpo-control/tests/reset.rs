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

#[test]
fn dog_run_model_edits_and_reset_follow_dm_control() {
    use mujoco_rs::prelude::*;

    let mut env = make_env("dog-run", 2, None).unwrap();
    let mut replay = make_env("dog-run", 0, None).unwrap();
    let m = env.physics().model();
    let floor = m.name_to_id(MjtObjBase::mjOBJ_GEOM, "floor").unwrap();
    assert_eq!(m.geom_size()[floor], [135.0, 135.0, 0.1]);
    for (kind, name) in [(MjtObjBase::mjOBJ_BODY, "ball"), (MjtObjBase::mjOBJ_GEOM, "target")] {
        assert!(m.name_to_id(kind, name).is_none(), "{name} is removed");
    }
    assert_eq!(m.ncam(), 2, "only the trackcom cameras stay");
    for _ in 0..10 {
        let obs = env.reset().unwrap();
        let d = env.physics().data();
        // Root: default position, a random yaw only.
        let q = &d.qpos()[3..7];
        assert_eq!((q[1], q[2]), (0.0, 0.0));
        assert!((q[0] * q[0] + q[3] * q[3] - 1.0).abs() < 1e-12);
        // Horizontal root velocities and yaw rate only.
        for (i, &v) in d.qvel().iter().enumerate() {
            assert_eq!(v != 0.0, [0, 1, 5].contains(&i), "qvel[{i}] = {v}");
        }
        assert!(d.act().iter().all(|a| (-1.0..1.0).contains(a) && *a != 0.0));
        // The first observation is that of the actuation-free forward pass
        // (dm_control's `after_reset`), as a replay from the state gives.
        let (state, params) = env.snapshot();
        assert_eq!(replay.restore(&state, &params).unwrap(), obs);
    }
}
