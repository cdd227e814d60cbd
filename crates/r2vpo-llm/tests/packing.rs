//! Packed micro-batches (samples end to end, no padding) against padded
//! rows on the candle backend: log-probs, entropies, each aggregation
//! mode's loss and gradients, and the weights after two optimizer steps;
//! then the trainer end to end with packing and a token budget.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use r2vpo::aggregate::{Aggregation, GlobalBatch};
use r2vpo::dual::DualConfig;
use r2vpo::learner::Learner;
use r2vpo::objective::{ObjectiveConfig, PolicyBatch};
use r2vpo_llm::backend::batch::{self, Inputs, MicroBatch};
use r2vpo_llm::backend::candle::{CandleBackend, Transformer};
use r2vpo_llm::backend::{forward_backward, Backend, OptimConfig, Policy};
use r2vpo_llm::experience::Sample;
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::train::TrainConfig;

mod common;

fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The values of `t` where `mask` is 1.
fn masked(t: &Tensor, mask: &Tensor) -> Vec<f32> {
    flat(t).into_iter().zip(flat(mask)).filter(|(_, m)| *m > 0.0).map(|(x, _)| x).collect()
}

/// max |a − b| over max(|b|, floor).
fn rel(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(floor, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Six samples whose prompts and responses span 1 to 40 tokens, in two
/// micro-batches of three, each holding two samples of one prompt (packed
/// once, then shared): every row but the longest is padded.
fn samples(vocab: u32) -> Vec<Sample> {
    let t = |n: usize, k: u32| (0..n as u32).map(|i| (i * 37 + k * 11 + 3) % vocab).collect::<Vec<u32>>();
    // (problem, prompt tokens, response tokens)
    let shapes = [(0, 5, 4), (0, 5, 40), (1, 9, 1), (2, 1, 12), (3, 30, 3), (3, 30, 25)];
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(problem, p, r))| Sample {
            problem,
            prompt_ids: t(p, 2 * problem as u32),
            response_ids: t(r, 2 * i as u32 + 1),
            reward: 0.0,
            correct: false,
            advantage: [1.0, -0.5, 0.25, -1.5, 0.75, -0.25][i],
            behaviour_logp: vec![0.0; r],
            ref_logp: None,
            version: 0,
        })
        .collect()
}

/// Qwen3's layout (grouped-query attention, q/k norms, untied head) and
/// SmolLM2's (Llama, tied embeddings).
fn configs() -> Vec<(&'static str, ModelConfig)> {
    vec![
        ("qwen3", ModelConfig::tiny(Architecture::Qwen3, 300, 64, 128, 2, 4, 2, false)),
        ("smollm2", ModelConfig::tiny(Architecture::Llama, 300, 64, 160, 2, 4, 4, true)),
    ]
}

/// Adam's ε well above the gradients' rounding, so an entry whose gradient
/// is noise moves by a noise-sized step rather than ±lr in either layout.
fn optim() -> OptimConfig {
    OptimConfig { lr: 1e-3, eps: 1e-3, weight_decay: 0.1, ..OptimConfig::default() }
}

fn backend(cfg: &ModelConfig) -> CandleBackend {
    let m = Transformer::new_random_with_std(cfg.clone(), 5, 0.1, DType::F32, &Device::Cpu).unwrap();
    CandleBackend::new(m, optim(), false).unwrap()
}

fn micro_batches(parts: &[Vec<&Sample>], packed: bool) -> Vec<MicroBatch> {
    parts
        .iter()
        .map(|p| {
            if packed {
                batch::pack_sequences(p, 0, &Device::Cpu).unwrap()
            } else {
                batch::pack(p, 0, &Device::Cpu).unwrap()
            }
        })
        .collect()
}

/// One optimizer step's forward/backward over `mbs` under R²VPO with
/// `agg`: the log-probs and the losses of each micro-batch, then the
/// accumulated gradients.
fn step(be: &mut CandleBackend, mbs: &[MicroBatch], agg: Aggregation) -> (Vec<Vec<f32>>, Vec<f32>) {
    let objective = ObjectiveConfig { aggregation: agg, ..ObjectiveConfig::default() };
    let learner = Learner::new(objective, &DualConfig { lambda0: 0.5, ..DualConfig::default() }).unwrap();
    let masks: Vec<&Tensor> = mbs.iter().map(|m| &m.mask).collect();
    let global = GlobalBatch::from_masks(&masks).unwrap().with_horizon(48.0);
    let (mut logps, mut losses) = (Vec::new(), Vec::new());
    for mb in mbs {
        let (fwd, loss, ()) = forward_backward::<_, r2vpo_llm::model::ModelError>(be, mb, false, |logp, _| {
            let batch = PolicyBatch { logp, old_logp: &mb.old_logp, advantages: &mb.advantages, mask: &mb.mask };
            Ok((learner.loss(&batch, &global).map_err(|e| candle_core::Error::Msg(e.to_string()))?.loss, ()))
        })
        .unwrap();
        logps.push(masked(&fwd.logp, &mb.mask));
        losses.push(loss.to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap());
    }
    (logps, losses)
}

fn weights(be: &CandleBackend) -> HashMap<String, Vec<f32>> {
    be.export(0).unwrap().tensors.iter().map(|(n, t)| (n.clone(), flat(t))).collect()
}

/// Packed equals padded for log-probs (scored and trained), entropies, each
/// aggregation mode's loss and gradients over two micro-batches, and the
/// weights after two AdamW steps, on two architectures. Bounds: the
/// layouts differ only in summation order (products of other shapes, the
/// attention's blocks starting at each sample), 1e-5 relative in f32.
#[test]
fn packed_micro_batches_equal_padded_rows() {
    for (name, cfg) in configs() {
        let s = samples(cfg.vocab_size as u32);
        let parts: Vec<Vec<&Sample>> = s.chunks(3).map(|c| c.iter().collect()).collect();
        let (padded, packed) = (micro_batches(&parts, false), micro_batches(&parts, true));
        for m in &packed {
            let Inputs::Packed(p) = &m.inputs else { panic!("packed") };
            // Two prompts (one shared by two samples) and three responses.
            assert_eq!(p.seqs.len(), 5, "{:?}", p.seqs);
            assert_eq!(p.seqs.iter().filter(|s| s.prefix.1 > 0).count(), 3);
        }
        for (a, b) in padded.iter().zip(&packed) {
            assert_eq!(flat(&a.mask), flat(&b.mask), "the same tail layout");
        }
        // Scoring (no graph) and the entropy bonus's path.
        let be = backend(&cfg);
        for (a, b) in padded.iter().zip(&packed) {
            let (x, y) = (be.score(a).unwrap(), be.score(b).unwrap());
            assert!(rel(&masked(&y, &b.mask), &masked(&x, &a.mask), 1.0) < 1e-5, "{name}: scored log-probs");
            // Slots left of a shorter response hold 0, as padded rows' do not matter.
            assert!(flat(&y).iter().zip(flat(&b.mask)).all(|(v, m)| m > 0.0 || *v == 0.0), "{name}");
        }
        let mut be = backend(&cfg);
        let (ea, eb) = (be.forward(&padded[1], true).unwrap(), be.forward(&packed[1], true).unwrap());
        let (ea, eb) = (ea.entropy.unwrap(), eb.entropy.unwrap());
        assert!(rel(&masked(&eb, &packed[1].mask), &masked(&ea, &padded[1].mask), 1.0) < 1e-5, "{name}: entropy");
        // Each aggregation mode: two optimizer steps from the same weights.
        for agg in [
            Aggregation::TokenMean,
            Aggregation::SeqMeanTokenMean,
            Aggregation::SeqMeanTokenSum,
            Aggregation::SeqMeanTokenSumNorm,
        ] {
            let (mut a, mut b) = (backend(&cfg), backend(&cfg));
            for k in 0..2 {
                let (la, xa) = step(&mut a, &padded, agg);
                let (lb, xb) = step(&mut b, &packed, agg);
                for (p, q) in la.iter().zip(&lb) {
                    assert!(rel(q, p, 1.0) < 1e-5, "{name} {agg:?} step {k}: log-probs");
                }
                assert!(rel(&xb, &xa, 1e-3) < 1e-5, "{name} {agg:?} step {k}: losses {xa:?} vs {xb:?}");
                let (ga, gb) = (a.gradients().unwrap(), b.gradients().unwrap());
                assert_eq!(ga.len(), gb.len());
                for (n, g) in &ga {
                    let d = rel(&flat(&gb[n]), &flat(g), 1e-6);
                    assert!(d < 1e-4, "{name} {agg:?} step {k}: gradient of {n} differs by {d:e} (relative)");
                }
                a.step(1.0).unwrap();
                b.step(1.0).unwrap();
            }
            let (wa, wb) = (weights(&a), weights(&b));
            for (n, w) in &wa {
                let d = w.iter().zip(&wb[n]).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                // AdamW moves each entry by at most ~lr a step: agreement
                // to 1 % of one step.
                assert!(d < 1e-5, "{name} {agg:?}: weight {n} after two steps differs by {d:e}");
            }
        }
    }
}

/// A prompt-less sample cannot be scored packed (its first response token
/// has no context): such a micro-batch falls back to padded rows.
#[test]
fn an_empty_prompt_falls_back_to_padded_rows() {
    let mut s = samples(300);
    s[0].prompt_ids.clear();
    let refs: Vec<&Sample> = s.iter().collect();
    assert!(matches!(batch::pack_sequences(&refs, 0, &Device::Cpu).unwrap().inputs, Inputs::Padded { .. }));
}

/// The trainer with packed micro-batches cut by a token budget smaller
/// than some samples: iteration 0 (one optimizer step from the same
/// weights on the same samples) reports the padded run's loss and
/// gradient norm, and the run trains to its end.
#[test]
fn the_trainer_packs_by_token_budget() {
    let base = TrainConfig { share_prompt_prefix: false, minibatch_size: 16, ..common::train::tiny(3) };
    let dir = tempfile::tempdir().unwrap();
    let padded = common::train::run(base.clone(), &dir.path().join("padded"));
    let packed = TrainConfig { pack_sequences: true, max_tokens_per_micro_batch: 90, ..base };
    let packed = common::train::run(packed, &dir.path().join("packed"));
    assert_eq!(padded.len(), packed.len());
    let (a, b) = (&padded[0], &packed[0]);
    assert_eq!((a.reward_mean, a.response_len_mean, a.updates), (b.reward_mean, b.response_len_mean, b.updates));
    // At ρ = 1 the loss is −Σ Â over the step, terms of order 1 that
    // cancel (group advantages sum to 0): its bound is on that scale.
    for (x, y, what) in [(a.loss, b.loss, "loss"), (a.grad_norm, b.grad_norm, "grad_norm")] {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(0.1), "{what}: {x} vs {y}");
    }
    assert!(packed.iter().all(|m| m.loss.is_finite() && m.skipped_steps == 0));
}

/// Gradient checkpointing on packed micro-batches: the same log-probs and
/// gradients as the whole graph (the recomputed layers run the same kernels
/// on the same inputs; only the order of the gradient sums differs).
#[test]
fn checkpointed_packed_equals_the_whole_graph() {
    for (name, cfg) in configs() {
        let s = samples(cfg.vocab_size as u32);
        let refs: Vec<&Sample> = s.iter().collect();
        let mb = batch::pack_sequences(&refs, 0, &Device::Cpu).unwrap();
        let mut out = Vec::new();
        for checkpointing in [false, true] {
            let m = Transformer::new_random_with_std(cfg.clone(), 5, 0.1, DType::F32, &Device::Cpu).unwrap();
            let mut be = CandleBackend::new(m, optim(), checkpointing).unwrap();
            let f = be.forward(&mb, false).unwrap();
            let n = mb.mask.elem_count();
            let seed: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let dlogp = (Tensor::from_vec(seed, mb.mask.dims(), &Device::Cpu).unwrap() * &mb.mask).unwrap();
            be.backward(&dlogp, None).unwrap();
            out.push((flat(&f.logp), be.gradients().unwrap()));
        }
        assert_eq!(out[0].0, out[1].0, "{name}: the same forward arithmetic");
        for (n, g) in &out[0].1 {
            let d = rel(&flat(&out[1].1[n]), &flat(g), 1e-6);
            assert!(d < 1e-5, "{name}: checkpointed gradient of {n} differs by {d:e}");
        }
    }
}
