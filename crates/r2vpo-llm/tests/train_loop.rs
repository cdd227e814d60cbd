//! The RL trainer end to end on a tiny random model (the embedded GGUF's
//! tokenizer and chat template, random weights): learning on a synthetic
//! reward, bit-exact resume, NaN handling, every algorithm preset.

use std::sync::atomic::AtomicBool;

use r2vpo_llm::train::{checkpoint, Outcome, TrainConfig, TrainError, Trainer};

mod common;

use common::train::{comparable, read_metrics, run, with_algo, EvenTokens};

/// The shared tiny run, checkpointed and with histograms every two
/// iterations.
fn tiny(iterations: usize) -> TrainConfig {
    TrainConfig { checkpoint_every: 2, histogram_every: 2, ..common::train::tiny(iterations) }
}

#[test]
fn r2vpo_on_learns_a_synthetic_reward() {
    let dir = tempfile::tempdir().unwrap();
    // One optimizer step per iteration over 4 prompts × 8 samples × 8 tokens.
    // 40 iterations at lr 2e-2: the reward rises by ≈ 0.4 here, far above
    // the ±0.03 batch noise. (20 at 5e-3 rose by 0.06 on one machine and
    // not at all on another: the trajectory follows the CPU's GEMM
    // rounding, so the margin must not be thin.)
    let mut cfg = tiny(40);
    cfg.group_size = 8;
    cfg.rollout_batch = 32;
    cfg.minibatch_size = 32;
    cfg.micro_batch_size = 16;
    cfg.sampling.max_new_tokens = 8;
    cfg.optim.lr = 2e-2;
    cfg.checkpoint_every = 0;
    if let Some(r) = cfg.model.random.as_mut() {
        r.init_std = 1.0;
    }
    let m = run(cfg, dir.path());
    assert_eq!(m.len(), 40);
    let first: f64 = m[..5].iter().map(|x| x.reward_mean).sum::<f64>() / 5.0;
    let last: f64 = m[35..].iter().map(|x| x.reward_mean).sum::<f64>() / 5.0;
    assert!(last > first + 0.15, "reward did not rise: first {first:.3}, last {last:.3}");
    assert!(m.iter().all(|x| x.updates == 1 && x.skipped_steps == 0));
    // Each minibatch is the fresh batch, so ρ = 1 up to the rounding
    // difference between incremental decoding and the full forward pass.
    assert!(m.iter().all(|x| (x.ratio_min - 1.0).abs() < 1e-3 && (x.ratio_max - 1.0).abs() < 1e-3), "{m:?}");
    // Histograms were written on iterations 0, 2, …, 38.
    let hist = std::fs::read_to_string(dir.path().join("ratio_hist.jsonl")).unwrap();
    assert_eq!(hist.lines().count(), 20);
}

#[test]
fn stopped_and_resumed_run_matches_uninterrupted_run() {
    for algo in ["r2vpo-off", "grpo"] {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let mut cfg = with_algo(tiny(5), algo);
        cfg.replay.minibatch_size = 8;
        let full = run(cfg.clone(), a.path());

        // Stop after the first iteration (as Ctrl-C does), then resume twice:
        // once more stopped, then to the end.
        let mut t = Trainer::with_reward(cfg.clone(), b.path(), Box::new(EvenTokens)).unwrap();
        assert_eq!(t.run(&AtomicBool::new(true), &mut |_| {}).unwrap(), Outcome::Stopped);
        drop(t);
        let mut t = Trainer::resume_with_reward(cfg.clone(), b.path(), Box::new(EvenTokens)).unwrap();
        assert_eq!(t.progress().iteration, 1);
        assert_eq!(t.run(&AtomicBool::new(true), &mut |_| {}).unwrap(), Outcome::Stopped);
        drop(t);
        // Simulate a kill after an un-checkpointed iteration: append a stray
        // metrics line that resume must drop.
        let mpath = b.path().join("metrics.jsonl");
        let mut text = std::fs::read_to_string(&mpath).unwrap();
        let first = text.lines().next().unwrap().to_string();
        text.push_str(&first);
        text.push('\n');
        std::fs::write(&mpath, text).unwrap();
        let mut t = Trainer::resume_with_reward(cfg.clone(), b.path(), Box::new(EvenTokens)).unwrap();
        assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
        let resumed = read_metrics(b.path());
        assert_eq!(comparable(&resumed), comparable(&full), "{algo}: resumed metrics differ");
        // Only the newest checkpoint is kept, and it is a loadable HF folder.
        let latest = checkpoint::latest(b.path()).unwrap().unwrap();
        assert!(latest.ends_with("iter-000005"), "{}", latest.display());
        assert!(latest.join("model.safetensors").exists() && latest.join("config.json").exists());
        let n = std::fs::read_dir(b.path().join("checkpoints")).unwrap().count();
        assert_eq!(n, 2, "one checkpoint folder plus the `latest` pointer");
    }
}

#[test]
fn non_finite_steps_are_skipped_then_stop_the_run() {
    let dir = tempfile::tempdir().unwrap();
    // An absurd learning rate: the first step throws the weights to ~1e30,
    // after which the forward pass overflows.
    let mut cfg = tiny(3);
    cfg.max_bad_steps = 2;
    cfg.optim.lr = 1e30;
    cfg.optim.weight_decay = 0.0;
    let mut t = Trainer::with_reward(cfg, dir.path(), Box::new(EvenTokens)).unwrap();
    let mut bad = 0;
    let err = t
        .run(&AtomicBool::new(false), &mut |e| {
            if let r2vpo_llm::train::Event::BadStep(_) = e {
                bad += 1
            }
        })
        .unwrap_err();
    assert!(matches!(err, TrainError::NonFinite { count: 2, .. }), "{err}");
    assert_eq!(bad, 2);
    let events = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
    let kinds: Vec<String> = events
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["event"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["run_started", "non_finite_step", "non_finite_step"], "{events}");
    // No checkpoint was written from the broken state.
    assert!(checkpoint::latest(dir.path()).unwrap().is_none());
}

#[test]
fn every_algorithm_preset_runs() {
    // r2vpo-on and grpo are the other tests' defaults.
    let skip = ["r2vpo", "r2vpo-on", "grpo"];
    for algo in r2vpo::algo::names().into_iter().filter(|a| !skip.contains(a)) {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = with_algo(tiny(2), algo);
        cfg.checkpoint_every = 0;
        let m = run(cfg, dir.path());
        assert_eq!(m.len(), 2, "{algo}");
        assert!(m.iter().all(|x| x.updates > 0 && x.loss.is_finite()), "{algo}: {m:?}");
    }
}

/// The rollout–trainer correction's weights reach the loss: from the
/// learner's recomputed log-probs over the sampler's, reported per
/// iteration, and refused where nothing is recomputed.
#[test]
fn rollout_correction_weighs_recomputed_against_sampled_logprobs() {
    use r2vpo::correction::RolloutCorrection;
    use r2vpo_llm::train::BehaviourLogprobs;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(2);
    cfg.checkpoint_every = 0;
    cfg.objective.rollout_correction = RolloutCorrection::TokenTis;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("objective.rollout_correction") && e.contains("recompute"), "{e}");
    cfg.behaviour_logprobs = BehaviourLogprobs::Recompute;
    let plain = run(TrainConfig { objective: Default::default(), ..cfg.clone() }, tempfile::tempdir().unwrap().path());
    let m = run(cfg, dir.path());
    for (x, p) in m.iter().zip(&plain) {
        let c = x.correction.expect("weights are reported");
        let mm = x.mismatch.expect("recompute measures the mismatch");
        // 16 samples of up to 6 tokens each, all weighed.
        assert!(c.tokens > 0 && c.tokens <= 16 * 6 && c.tokens == mm.tokens, "{c:?} {mm:?}");
        // In-process sampling and recomputing differ by rounding only: the
        // weights are 1 to that precision and nothing is capped at 2.
        assert!((c.weight_mean - 1.0).abs() < 1e-3 && c.capped_frac == 0.0, "{c:?}");
        assert!((x.loss - p.loss).abs() < 1e-3 * (1.0 + p.loss.abs()), "{} vs {}", x.loss, p.loss);
        assert!(p.correction.is_none());
    }
}

/// Every other problem (by its id's last digit) is one the policy cannot
/// move: all its samples score 1, a zero-variance group.
struct HalfFlat;

impl r2vpo_llm::train::RewardFn for HalfFlat {
    fn score(&self, p: &r2vpo_llm::data::Problem, g: &r2vpo_llm::sample::Generation) -> r2vpo_llm::train::Scored {
        let flat = p.id.bytes().last().is_some_and(|b| b % 2 == 0);
        if flat {
            r2vpo_llm::train::Scored { reward: 1.0, correct: true }
        } else {
            r2vpo_llm::train::RewardFn::score(&EvenTokens, p, g)
        }
    }
}

/// DAPO's dynamic sampling: without over-sampling the filter shrinks the
/// batch; with it, further batches refill it to `prompts_per_iter` groups
/// with a signal (or stop at the cap and say so); overlong shaping lowers
/// the rewards of responses that reach the length limit.
#[test]
fn dapo_oversampling_refills_the_filtered_batch() {
    use r2vpo_llm::train::Outcome;
    let go = |cfg: TrainConfig| {
        let dir = tempfile::tempdir().unwrap();
        let mut t = Trainer::with_reward(cfg, dir.path(), Box::new(HalfFlat)).unwrap();
        assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
        let events = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap_or_default();
        (read_metrics(dir.path()), events)
    };
    let mut cfg = tiny(3);
    cfg.checkpoint_every = 0;
    cfg.filter_zero_variance = true;
    let (shrunk, _) = go(cfg.clone());
    assert!(shrunk.iter().any(|m| m.filtered_groups > 0), "the fixture has flat groups: {shrunk:?}");
    assert!(shrunk.iter().all(|m| m.gen_batches == 1 && m.refilled_groups == 0));
    cfg.max_gen_batches = 8;
    let (full, events) = go(cfg.clone());
    for m in &full {
        // 4 groups × 4 samples trained, the first batch's flat ones dropped.
        let trained = 4 - m.zero_variance_groups + m.refilled_groups;
        assert_eq!(trained, 4, "{m:?}");
        assert_eq!(m.refilled_groups, m.zero_variance_groups, "{m:?}");
        assert!(m.gen_batches > usize::from(m.zero_variance_groups > 0), "{m:?}");
    }
    assert!(full.iter().any(|m| m.gen_batches > 1));
    assert!(!events.contains("dynamic_sampling_short"), "{events}");
    // At a cap of 2 batches a short batch trains on what it has and says so
    // (half the problems are flat, so two batches of 4 rarely give 4).
    cfg.max_gen_batches = 2;
    cfg.prompts_per_iter = 4;
    let (capped, events) = go(cfg.clone());
    assert!(capped.iter().all(|m| m.gen_batches <= 2));
    if capped.iter().any(|m| 4 - m.zero_variance_groups + m.refilled_groups < 4) {
        assert!(events.contains("dynamic_sampling_short"), "{events}");
    }
    // Refused where it cannot work.
    let e = TrainConfig { filter_zero_variance: false, ..cfg.clone() }.validate().unwrap_err().to_string();
    assert!(e.contains("max_gen_batches") && e.contains("filter_zero_variance"), "{e}");
    // Overlong shaping: every response of this tiny run reaches its 6-token
    // limit (no stop token is likely from a random model), so with a buffer
    // of 3 the shaping takes up to the full penalty off its reward.
    let mut plain = tiny(1);
    plain.checkpoint_every = 0;
    let shaped = TrainConfig { overlong_buffer: 3, overlong_penalty: 0.5, ..plain.clone() };
    let (a, _) = go(plain);
    let (b, _) = go(shaped);
    assert_eq!(a[0].response_len_mean, b[0].response_len_mean, "shaping does not change sampling");
    assert!(b[0].reward_mean < a[0].reward_mean - 0.1, "{} vs {}", b[0].reward_mean, a[0].reward_mean);
    assert!(b[0].reward_mean >= a[0].reward_mean - 0.5 - 1e-6);
}

/// The exported policy is a Hugging Face folder that loads back with the
/// same weights, tokenizer ids, stop ids and chat template.
#[test]
fn exported_policy_loads_back() {
    use candle_core::{DType, Device, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(1);
    cfg.checkpoint_every = 0;
    let mut t = Trainer::with_reward(cfg, dir.path(), Box::new(EvenTokens)).unwrap();
    t.run(&AtomicBool::new(false), &mut |_| {}).unwrap();
    let out = dir.path().join("model");
    t.export(&out).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let tok = r2vpo_llm::tokenizer::Tokenizer::load(&out).unwrap();
    let orig = t.tokenizer();
    let text = "<|im_start|>user\nWhat is 12 + 7?  Ünïcode ✓<|im_end|>\n";
    assert_eq!(tok.encode(text, false).unwrap(), orig.encode(text, false).unwrap());
    assert_eq!(tok.eos_token_id(), orig.eos_token_id());
    assert_eq!(tok.pad_token_id(), orig.pad_token_id());
    assert_eq!(tok.chat_template(), orig.chat_template());
    let m = r2vpo_llm::backend::candle::load_model(&out, DType::F32, &Device::Cpu).unwrap();
    // The trained policy's weights, bit for bit.
    let w = t.policy().export(0).unwrap();
    let flat = |x: &Tensor| x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let vars = m.named_vars();
    assert_eq!(vars.len(), w.tensors.len());
    for (n, v) in &vars {
        assert_eq!(flat(v.as_tensor()), flat(&w.tensors[n]), "{n}");
    }
}

/// Issue #17: a run keeps only its newest `keep_checkpoints` checkpoints
/// (each ≈ 12 bytes a parameter), and `latest` names the newest.
#[test]
fn only_the_newest_checkpoints_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(4);
    cfg.checkpoint_every = 1;
    cfg.keep_checkpoints = 2;
    run(cfg, dir.path());
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("iter-"))
        .collect();
    names.sort();
    assert_eq!(names, ["iter-000003", "iter-000004"]);
    assert_eq!(std::fs::read_to_string(dir.path().join("checkpoints/latest")).unwrap(), "iter-000004");
}

#[test]
fn activation_checkpointing_trains_like_the_full_graph_and_refuses_what_it_cannot_do() {
    // One optimizer step per iteration (4 micro-batches accumulated), so
    // iteration 0 is one step from the same weights on the same samples.
    // Later iterations may sample differently: Adam divides by √v, which
    // turns float rounding in near-zero gradients into visible steps.
    // Padded rows (packed ones: `packing.rs`).
    let base = TrainConfig { share_prompt_prefix: false, pack_sequences: false, minibatch_size: 16, ..tiny(3) };
    let dir = tempfile::tempdir().unwrap();
    let plain = run(base.clone(), &dir.path().join("plain"));
    let ck = run(TrainConfig { activation_checkpointing: true, ..base.clone() }, &dir.path().join("ck"));
    assert_eq!(plain.len(), ck.len());
    let (a, b) = (&plain[0], &ck[0]);
    assert_eq!((a.reward_mean, a.response_len_mean, a.updates), (b.reward_mean, b.response_len_mean, b.updates));
    for (x, y, what) in
        [(a.loss, b.loss, "loss"), (a.grad_norm, b.grad_norm, "grad_norm"), (a.sq_dev, b.sq_dev, "sq_dev")]
    {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-3), "{what}: {x} vs {y}");
    }
    assert!(ck.iter().all(|m| m.loss.is_finite() && m.grad_norm.is_finite() && m.skipped_steps == 0));
    for (cfg, why) in [
        (TrainConfig { activation_checkpointing: true, pack_sequences: false, ..tiny(1) }, "share_prompt_prefix"),
        (TrainConfig { activation_checkpointing: true, entropy_coef: 0.01, ..base }, "entropy_coef"),
    ] {
        let err = cfg.validate().unwrap_err();
        assert!(
            matches!(&err, r2vpo_llm::train::TrainError::Config { field, .. } if field == "activation_checkpointing"),
            "{err}"
        );
        assert!(err.to_string().contains(why), "{err}");
    }
}
