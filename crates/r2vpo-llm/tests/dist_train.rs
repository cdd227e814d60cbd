//! The data-parallel learner on a task whose advantages vary: ranks are
//! threads of this process joined over Gloo on loopback, each a whole
//! [`Trainer`] on the torch backend (libtorch's CPU kernels) with the
//! [`EvenTokens`] reward, which a random model earns in part, so every
//! group's rewards differ and the policy-gradient term of every
//! micro-batch is non-zero (the CLI's `llm_dist` tests run real processes
//! on the arithmetic task, where a random model's advantages are all 0 and
//! only the entropy bonus crosses ranks).
//!
//! What would go unseen without it: a rank whose share of the gradient is
//! left out of the sum, or ranks that each train every micro-batch and
//! never sum (the weights would then agree with one process). The first
//! moves the gradient norm by percents and the weights by 2·lr where a
//! partial gradient's sign differs from the whole's (AdamW's first step
//! moves each weight by lr·sign g); the second shows in each rank's token
//! count, `rank_train_tokens`.
//!
//! Tolerance as in the CLI's tests (`llm_dist.rs`): the ranks' sums differ
//! from one process's by f32 rounding; 1e-4 relative on figures, 1e-5 on
//! weights at lr 1e-5.
#![cfg(feature = "torch")]

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use r2vpo::dual::DualMode;
use r2vpo_llm::parallel::c10d::{ProcessGroup, Store};
use r2vpo_llm::train::{BackendKind, IterMetrics, ModelSource, Outcome, TrainConfig, Trainer};

mod common;

use common::train::{read_metrics, EvenTokens};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Four groups of four samples per iteration, one group per sampler call
/// (dealt to the ranks 2/2 or 2/1/1); two optimizer steps of four
/// micro-batches each (ranks hold 2/2 or 2/1/1 of them); λ moved by every
/// step, so a λ one rank moved alone would show.
fn config(zero_stage: u8) -> TrainConfig {
    let tiny = common::train::tiny(2);
    let mut c = TrainConfig {
        model: ModelSource { backend: BackendKind::Torch, ..tiny.model.clone() },
        rollout_batch: 4,
        minibatch_size: 8,
        micro_batch_size: 2,
        checkpoint_every: 1,
        histogram_every: 1,
        eval_at_start: false,
        eval_at_end: false,
        share_prompt_prefix: false,
        ..tiny
    };
    c.optim.lr = 1e-5;
    c.dual.mode = DualMode::Adaptive;
    c.dual.eta = 1000.0;
    c.dual.delta = 1e-9;
    c.dist.zero_stage = zero_stage;
    c
}

/// One process's run of `cfg` into `dir`.
fn alone(cfg: &TrainConfig, dir: &Path) {
    let mut t = Trainer::with_reward(cfg.clone(), dir, Box::new(EvenTokens)).unwrap();
    assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
}

/// `world` ranks, one thread each, train `cfg`: rank 0 into `dir`, the
/// others into scratch folders of their own (as `llm train`'s followers
/// do). Returns each rank's final weights.
fn ranks(cfg: &TrainConfig, dir: &Path, world: usize) -> Vec<Vec<f32>> {
    let server = Store::serve("127.0.0.1", 0, None, TIMEOUT).unwrap();
    let port = server.port();
    let scratch = tempfile::tempdir().unwrap();
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            let cfg = cfg.clone();
            let dir = if rank == 0 { dir.to_path_buf() } else { scratch.path().join(format!("rank{rank}")) };
            std::thread::spawn(move || {
                let store = Store::connect("127.0.0.1", port, "/worker/attempt_0", Some(world), TIMEOUT).unwrap();
                let group = ProcessGroup::over(store, "train/", rank, world, TIMEOUT).unwrap();
                let mut t = Trainer::with_reward(cfg, &dir, Box::new(EvenTokens)).unwrap();
                t.set_group(Box::new(group)).unwrap();
                assert_eq!(t.run(&AtomicBool::new(false), &mut |_| {}).unwrap(), Outcome::Finished);
                let out = dir.join("export");
                t.export(&out).unwrap();
                weights(&out.join("model.safetensors"))
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(server);
    out
}

fn weights(file: &Path) -> Vec<f32> {
    let t = candle_core::safetensors::load(file, &candle_core::Device::Cpu).unwrap();
    let mut names: Vec<&String> = t.keys().collect();
    names.sort();
    names.iter().flat_map(|n| t[*n].flatten_all().unwrap().to_vec1::<f32>().unwrap()).collect()
}

/// The newest checkpoint's optimizer state, by name.
fn checkpoint_moments(run: &Path) -> std::collections::HashMap<String, candle_core::Tensor> {
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let file = run.join("checkpoints").join(latest.trim()).join("optimizer.safetensors");
    candle_core::safetensors::load(file, &candle_core::Device::Cpu).unwrap()
}

fn checkpoint_weights(run: &Path) -> Vec<f32> {
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    weights(&run.join("checkpoints").join(latest.trim()).join("model.safetensors"))
}

/// Within 1e-4 of the larger of the two at `scale` or more.
fn close(a: f64, b: f64, scale: f64) -> bool {
    (a - b).abs() <= 1e-4 * a.abs().max(b.abs()).max(scale)
}

fn assert_same_run(one: &[IterMetrics], many: &[IterMetrics], what: &str) {
    assert_eq!(one.len(), many.len(), "{what}");
    for (a, b) in one.iter().zip(many) {
        // The advantages vary: the policy-gradient term is what moves.
        assert_eq!(a.zero_variance_groups, 0, "{what}: every group's rewards differ: {a:?}");
        assert!(a.grad_norm > 1e-3, "{what}: {a:?}");
        // The losses are means of advantage-weighted ratios whose
        // advantages sum to 0 in every group, so they cancel to rounding
        // (≈ 1e-6) and are compared at the scale of their terms (1); the
        // other figures relatively.
        for (k, p, q, scale) in [
            ("loss", a.loss, b.loss, 1.0),
            ("pg_loss", a.pg_loss, b.pg_loss, 1.0),
            ("grad_norm", a.grad_norm, b.grad_norm, 1e-3),
            ("sq_dev", a.sq_dev, b.sq_dev, 1e-3),
            ("lambda", a.lambda, b.lambda, 1e-3),
            ("ratio_mean", a.ratio_mean, b.ratio_mean, 1e-3),
            ("reward_mean", a.reward_mean, b.reward_mean, 1e-3),
        ] {
            assert!(close(p, q, scale), "{what}: {k} {p} vs {q}");
        }
        assert!(b.lambda > 0.0, "{what}: λ never moved");
    }
}

/// 2 and 3 ranks (shares 2/2 and 2/1/1 of each step's four micro-batches)
/// train what one process trains under ZeRO 0, 1 and 2 (and ZeRO-2 with
/// checkpointed layers, reducing during the backward), with rewards and
/// advantages that vary; each rank ran its share's tokens only, and every
/// rank ends with the weights rank 0 checkpoints.
#[test]
fn ranks_with_varying_advantages_train_what_one_process_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let one_dir = tmp.path().join("one");
    alone(&config(1), &one_dir);
    let one = read_metrics(&one_dir);
    let w1 = checkpoint_weights(&one_dir);
    // With checkpointed layers ZeRO-2 reduces each layer's gradients
    // during the backward; at 3 ranks the last round of each step has one
    // micro-batch, so two ranks join its reduces with zeros.
    for (world, zero, layered) in [(2, 0, false), (3, 1, false), (3, 2, false), (2, 2, true), (3, 2, true)] {
        let what = format!("{world} ranks, ZeRO-{zero}{}", if layered { ", checkpointed layers" } else { "" });
        let dir = tmp.path().join(format!("ranks{world}-zero{zero}-{layered}"));
        let cfg = TrainConfig { activation_checkpointing: layered, ..config(zero) };
        let per_rank = ranks(&cfg, &dir, world);
        let many = read_metrics(&dir);
        assert_same_run(&one, &many, &what);
        for (a, b) in one.iter().zip(&many) {
            // Each rank trained the tokens of its micro-batches (every
            // world-th of each step's), which add up to the step's.
            let tokens = b.rank_train_tokens.clone().unwrap_or_else(|| panic!("{what}: rank_train_tokens: {b:?}"));
            assert_eq!(tokens.len(), world, "{what}");
            assert_eq!(
                tokens.iter().sum::<u64>(),
                a.trained_tokens as u64,
                "{what}: {tokens:?} vs {}",
                a.trained_tokens
            );
            assert!(tokens.iter().all(|&t| t > 0 && t < a.trained_tokens as u64), "{what}: {tokens:?}");
            assert!(a.rank_train_tokens.is_none(), "one process reports no ranks");
        }
        let w = checkpoint_weights(&dir);
        let worst = w1.iter().zip(&w).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{what}: weights differ from one process's by {worst}");
        for (r, wr) in per_rank.iter().enumerate() {
            assert_eq!(wr, &w, "{what}: rank {r}'s weights are rank 0's checkpoint");
        }
        // The optimizer file rank 0 wrote as the owners sent their moments
        // holds one process's moments, name for name.
        let (m1, mn) = (checkpoint_moments(&one_dir), checkpoint_moments(&dir));
        assert_eq!(m1.len(), mn.len(), "{what}: optimizer tensors");
        for (name, a) in &m1 {
            let b = mn.get(name).unwrap_or_else(|| panic!("{what}: no `{name}` in the ranks' optimizer file"));
            assert_eq!(a.dims(), b.dims(), "{what}: {name}");
            let (a, b) = (
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(scale > 0.0 && worst <= 1e-3 * scale, "{what}: {name} differs by {worst} at scale {scale}");
        }
    }
}

/// Packed micro-batches cut by a token budget and dealt to the ranks by
/// tokens: 2 ranks under ZeRO-1 and 3 under ZeRO-2 with checkpointed
/// layers train what one packed process trains (the same micro-batches,
/// so the rank tolerance), every rank trains tokens and their counts add
/// up to the step's; and the packed runs match one process on padded
/// rows of two. Against padded rows each log-prob rounds differently (by
/// ~1e-6), which E[(ρ − 1)²] ≈ 7e-6 at ρ − 1 ≈ 3e-3 (and λ, which sums it)
/// amplifies to ~1e-3 relative: those two are compared at 1e-2, the loss,
/// gradient norm and weights at the rank tolerance.
#[test]
fn packed_token_budget_ranks_train_what_one_process_trains() {
    let tmp = tempfile::tempdir().unwrap();
    let padded_dir = tmp.path().join("padded");
    alone(&config(1), &padded_dir);
    let padded = read_metrics(&padded_dir);
    let w_padded = checkpoint_weights(&padded_dir);
    let packed = |zero: u8, layered: bool| TrainConfig {
        pack_sequences: true,
        max_tokens_per_micro_batch: 80,
        activation_checkpointing: layered,
        ..config(zero)
    };
    let one_dir = tmp.path().join("one");
    alone(&packed(1, false), &one_dir);
    let one = read_metrics(&one_dir);
    for (a, b) in padded.iter().zip(&one) {
        for (k, p, q, tol) in [
            ("loss", a.loss, b.loss, 1e-4),
            ("grad_norm", a.grad_norm, b.grad_norm, 1e-4),
            ("sq_dev", a.sq_dev, b.sq_dev, 1e-2),
            ("lambda", a.lambda, b.lambda, 1e-2),
        ] {
            assert!((p - q).abs() <= tol * p.abs().max(q.abs()).max(1e-3), "packed against padded: {k} {p} vs {q}");
        }
    }
    let w1 = checkpoint_weights(&one_dir);
    let worst = w_padded.iter().zip(&w1).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-5, "packed weights differ from padded rows' by {worst}");
    for (world, zero, layered) in [(2, 1, false), (3, 2, true)] {
        let what = format!("packed, {world} ranks, ZeRO-{zero}");
        let dir = tmp.path().join(format!("packed{world}-zero{zero}"));
        ranks(&packed(zero, layered), &dir, world);
        let many = read_metrics(&dir);
        assert_same_run(&one, &many, &what);
        for (a, b) in one.iter().zip(&many) {
            let tokens = b.rank_train_tokens.clone().unwrap_or_else(|| panic!("{what}: rank_train_tokens: {b:?}"));
            assert_eq!(tokens.iter().sum::<u64>(), a.trained_tokens as u64, "{what}: {tokens:?}");
            assert!(tokens.iter().all(|&t| t > 0), "{what}: every rank trains: {tokens:?}");
        }
        let w = checkpoint_weights(&dir);
        let worst = w1.iter().zip(&w).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-5, "{what}: weights differ from one process's by {worst}");
    }
}
