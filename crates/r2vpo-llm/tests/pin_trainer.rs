//! Pins short seeded `llm train` runs bit for bit, so refactors of the update
//! path (the learner contract, the update schedule) are proven to change
//! nothing. One golden file per many-row matmul path, each recorded with
//! `RAYON_NUM_THREADS=2` on a machine of the development kind that runs
//! it: `llm-train-amx.json` on AMX (x86-64 with AVX-512 and AMX),
//! `llm-train-avx2+openblas-haswell.json` on an AMD EPYC Zen 3 (the forward
//! and the layers' backward on `model::avx2`'s kernel, the LM head's
//! backward on OpenBLAS's Haswell kernels), and
//! `llm-train-gemm-avx512.json` and `llm-train-gemm-avx2.json` on gemm alone
//! (`R2VPO_MATMUL=gemm`) on those two machines. The kernels are picked from
//! the CPU, so a machine with other SIMD may legitimately differ: re-record
//! with `R2VPO_BLESS=1 cargo test -p r2vpo-llm --test pin_trainer` there,
//! and never to make a refactor pass.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use r2vpo_llm::data::Problem;
use r2vpo_llm::sample::Generation;
use r2vpo_llm::train::{IterMetrics, ModelSource, Outcome, RewardFn, Scored, TrainConfig, Trainer};

/// Fraction of even token ids: a dense reward a random model moves on.
struct EvenTokens;

impl RewardFn for EvenTokens {
    fn score(&self, _: &Problem, g: &Generation) -> Scored {
        let n = g.token_ids.len().max(1) as f64;
        let even = g.token_ids.iter().filter(|&&t| t % 2 == 0).count() as f64 / n;
        Scored { reward: even, correct: even > 0.5 }
    }
}

fn config(algo: &str) -> TrainConfig {
    let gguf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{} missing (run `make deps`)", gguf.display());
    let mut c = TrainConfig {
        model: ModelSource::tiny_random(gguf.to_string_lossy().into_owned(), 7),
        iterations: 4,
        prompts_per_iter: 4,
        group_size: 4,
        rollout_batch: 16,
        minibatch_size: 8,
        micro_batch_size: 4,
        checkpoint_every: 0,
        histogram_every: 0,
        eval_at_start: false,
        eval_at_end: false,
        ..TrainConfig::default()
    };
    c.sampling.max_new_tokens = 6;
    c.optim.lr = 3e-3;
    c.data.count = 50;
    c.replay.minibatch_size = 8;
    c.replay.capacity_iters = 2;
    // The algorithm table, applied as `--algo` applies it.
    let a = r2vpo::algo::find(algo).unwrap();
    a.objective.apply(&mut c.objective);
    c.mode = a.mode;
    // A λ that moves fast enough to matter within four iterations.
    c.dual.eta = 5.0;
    c
}

#[test]
fn seeded_runs_are_unchanged_bit_for_bit() {
    let mut all = serde_json::Map::new();
    for algo in ["grpo", "r2vpo-on", "r2vpo-off", "grpo-off", "grpo-kl"] {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trainer::with_reward(config(algo), dir.path(), Box::new(EvenTokens)).unwrap();
        assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
        let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        let ms: Vec<IterMetrics> = text
            .lines()
            .map(|l| IterMetrics { timing: Default::default(), ..serde_json::from_str(l).unwrap() })
            .collect();
        all.insert(algo.into(), serde_json::to_value(&ms).unwrap());
    }
    let got = serde_json::to_string_pretty(&all).unwrap() + "\n";
    // The learner's many-row products run on AMX where the CPU has it, else
    // on gemm with the backward on OpenBLAS (its kernels for this CPU), on
    // gemm alone without it (or under R2VPO_MATMUL=gemm): sums in different
    // orders, so one golden file each.
    let name = format!("llm-train-{}.json", r2vpo_llm::model::openblas::backend());
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/pin").join(name);
    r2vpo_report::golden::assert_golden(&path, &got);
}
