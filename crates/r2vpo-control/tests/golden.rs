//! Replays golden trajectories recorded from dm_control 1.0.50 / MuJoCo
//! 3.17.0 (`scripts/dmc_golden.py`) and checks observations and rewards.

use std::path::PathBuf;

use r2vpo_control::{make_env, task_names, PhysicsState};
use serde::Deserialize;

const TOL: f64 = 1e-9;

#[derive(Deserialize)]
struct Golden {
    task: String,
    n_sub_steps: usize,
    step_limit: f64,
    state: PhysicsState,
    episode_params: Vec<f64>,
    actions: Vec<Vec<f64>>,
    observations: Vec<Vec<f64>>,
    rewards: Vec<f64>,
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// (max observation diff, max reward diff) over the replay.
fn replay(name: &str) -> (f64, f64) {
    let path = golden_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let g: Golden = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(g.task, name);
    let mut env = make_env(name, 0, None).unwrap();
    assert_eq!(env.physics().n_sub_steps(), g.n_sub_steps, "{name}: n_sub_steps");
    assert_eq!(env.episode_steps(), g.step_limit.ceil() as usize, "{name}: episode length");
    assert_eq!(env.episode_steps(), 1000, "{name}: episode length");

    let obs0 = env.restore(&g.state, &g.episode_params).unwrap();
    let mut max_obs = max_abs_diff(&obs0, &g.observations[0]);
    assert!(max_obs <= TOL, "{name}: initial observation differs by {max_obs}");
    let mut max_rew: f64 = 0.0;
    for (t, action) in g.actions.iter().enumerate() {
        let (obs, step) = env.step(action);
        assert!(step.warning.is_none(), "{name}: step {t}: {:?}", step.warning);
        assert!(!step.truncated);
        let d_obs = max_abs_diff(&obs, &g.observations[t + 1]);
        let d_rew = (step.reward - g.rewards[t]).abs();
        assert!(
            d_obs <= TOL && d_rew <= TOL,
            "{name}: step {t}: obs diff {d_obs}, reward {} vs {} (obs {obs:?} vs {:?})",
            step.reward,
            g.rewards[t],
            g.observations[t + 1]
        );
        max_obs = max_obs.max(d_obs);
        max_rew = max_rew.max(d_rew);
    }
    (max_obs, max_rew)
}

#[test]
fn every_task_matches_dm_control() {
    let mut failures = Vec::new();
    for name in task_names() {
        match std::panic::catch_unwind(|| replay(name)) {
            Ok((o, r)) => eprintln!("{name:26} max |Δobs| = {o:.3e}  max |Δreward| = {r:.3e}"),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{name}: {}", msg.chars().take(600).collect::<String>()));
            }
        }
    }
    assert!(failures.is_empty(), "golden mismatches:\n{}", failures.join("\n"));
}

#[test]
fn golden_files_cover_every_task() {
    for name in task_names() {
        let p = golden_dir().join(format!("{name}.json"));
        assert!(p.is_file(), "missing golden file {}", p.display());
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len < 200_000, "{} is {len} bytes", p.display());
    }
}
