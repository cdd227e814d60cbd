//! MuJoCo must not write `MUJOCO_LOG.TXT` into the working directory, neither
//! for model-compiler warnings (cheetah's `settotalmass`) nor for simulation
//! warnings. Its own test binary, because it changes the process CWD.

use r2vpo_control::make_env;

#[test]
fn no_mujoco_log_file_in_cwd() {
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    let mut env = make_env("cheetah-run", 0, None).unwrap();
    env.reset().unwrap();
    let mut state = env.physics().state();
    state.qvel[0] = f64::NAN;
    // An invalid state: MuJoCo warns (and would log) during forward or step.
    let warned = match env.restore(&state, &[]) {
        Err(_) => true,
        Ok(_) => env.step(&[0.0; 6]).1.warning.is_some(),
    };
    assert!(warned, "expected a MuJoCo warning");
    let log = dir.path().join("MUJOCO_LOG.TXT");
    assert!(!log.exists(), "MuJoCo wrote {}", log.display());
}
