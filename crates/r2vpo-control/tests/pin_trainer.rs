//! Pins short seeded `control train` runs bit for bit, so refactors of the
//! update path (the learner contract, the update schedule, the split of the
//! trainer) are proven to change nothing. The networks' products run on
//! gemm, whose kernels (and so sums) differ between AVX-512 and AVX2: one
//! golden file each, `control-train-avx512.json` recorded on the Xeon of
//! the development kind, `control-train-avx2.json` on its AMD EPYC (Zen 3).
//! Re-record with `R2VPO_BLESS=1` only on a machine whose floating-point
//! results legitimately differ, never to make a refactor pass.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use r2vpo_control::trainer::{algo_overrides, TrainConfig, Trainer};

fn config(algo: &str) -> TrainConfig {
    let mut cfg = TrainConfig {
        task: "cartpole-swingup".into(),
        total_env_steps: 4 * 16 * 4,
        num_envs: 4,
        unroll: 16,
        batch_size: 4,
        minibatches: 3,
        epochs: 2,
        eval_every: 0,
        eval_episodes: 0,
        ..TrainConfig::default()
    };
    algo_overrides(algo).unwrap(); // refuses replay algorithms
    r2vpo::algo::find(algo).unwrap().objective.apply(&mut cfg.objective);
    cfg
}

#[test]
fn seeded_runs_are_unchanged_bit_for_bit() {
    let mut all = serde_json::Map::new();
    for (name, algo, adaptive) in [("ppo", "ppo", false), ("r2vpo", "r2vpo", false), ("r2vpo-adaptive", "r2vpo", true)]
    {
        let mut cfg = config(algo);
        if adaptive {
            cfg.dual.mode = r2vpo::dual::DualMode::Adaptive;
            cfg.dual.eta = 5.0;
        }
        let mut t = Trainer::new(cfg).unwrap();
        let ms: Vec<_> =
            t.run(None, None, &AtomicBool::new(false), |_| {}).unwrap().iter().map(|m| m.without_timing()).collect();
        all.insert(name.into(), serde_json::to_value(&ms).unwrap());
    }
    let got = serde_json::to_string_pretty(&all).unwrap() + "\n";
    let simd = r2vpo_report::golden::gemm_simd();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("golden/pin/control-train-{simd}.json"));
    r2vpo_report::golden::assert_golden(&path, &got);
}
