//! The tiny seeded trainer that `train_loop.rs`, `pin_trainer.rs` and
//! `torch_backend.rs` run: a random model with the embedded GGUF's tokenizer
//! and chat template, four prompts × four samples of six tokens, and a dense
//! reward it can learn.

use std::path::PathBuf;

use r2vpo_llm::data::Problem;
use r2vpo_llm::sample::Generation;
use r2vpo_llm::train::{ModelSource, RewardFn, Scored, TrainConfig};

/// The embedded SmolLM2 GGUF (fetched by `make deps`).
pub fn gguf() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.deps/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "{} missing (run `make deps`)", p.display());
    p.to_string_lossy().into_owned()
}

/// Fraction of response tokens with an even id: a dense signal a random
/// model can learn in a few steps (it only needs to shift its output bias).
pub struct EvenTokens;

impl RewardFn for EvenTokens {
    fn score(&self, _: &Problem, g: &Generation) -> Scored {
        let n = g.token_ids.len().max(1) as f64;
        let even = g.token_ids.iter().filter(|&&t| t % 2 == 0).count() as f64 / n;
        Scored { reward: even, correct: even > 0.5 }
    }
}

/// The tiny run's shape for `iterations` iterations; checkpoints,
/// histograms and evaluations are left at the defaults for each test to set.
pub fn tiny(iterations: usize) -> TrainConfig {
    let mut c = TrainConfig {
        model: ModelSource::tiny_random(gguf(), 7),
        iterations,
        prompts_per_iter: 4,
        group_size: 4,
        rollout_batch: 16,
        minibatch_size: 8,
        micro_batch_size: 4,
        ..TrainConfig::default()
    };
    c.sampling.max_new_tokens = 6;
    c.optim.lr = 3e-3;
    c.data.count = 50;
    c
}

/// Applies a named algorithm from the core's table (what `--algo` does
/// through the CLI's TOML layering).
pub fn with_algo(mut cfg: TrainConfig, algo: &str) -> TrainConfig {
    let a = r2vpo::algo::find(algo).unwrap();
    a.objective.apply(&mut cfg.objective);
    a.apply_dual(&mut cfg.dual);
    a.apply_group_norm(&mut cfg.group_norm);
    cfg.mode = a.mode;
    cfg
}

/// Runs `cfg` to its end in `dir` on the [`EvenTokens`] reward and returns
/// its metrics.
pub fn run(cfg: TrainConfig, dir: &std::path::Path) -> Vec<r2vpo_llm::train::IterMetrics> {
    use r2vpo_llm::train::{Outcome, Trainer};
    let mut t = Trainer::with_reward(cfg, dir, Box::new(EvenTokens)).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    assert_eq!(t.run(&stop, &mut |_| {}).unwrap(), Outcome::Finished);
    read_metrics(dir)
}

/// A run's `metrics.jsonl`.
pub fn read_metrics(dir: &std::path::Path) -> Vec<r2vpo_llm::train::IterMetrics> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Metrics without the wall-clock fields.
pub fn comparable(m: &[r2vpo_llm::train::IterMetrics]) -> Vec<r2vpo_llm::train::IterMetrics> {
    m.iter().map(|x| r2vpo_llm::train::IterMetrics { timing: Default::default(), ..x.clone() }).collect()
}
