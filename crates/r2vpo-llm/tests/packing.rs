//! Packed micro-batches (samples end to end, no padding) against padded
//! rows on the candle backend: log-probs, entropies, each aggregation
//! mode's loss and gradients, and the weights after two optimizer steps;
//! then the trainer end to end with packing and a token budget. (The torch
//! backend's: `torch_backend.rs`.)

use candle_core::{DType, Device, Tensor};
use r2vpo_llm::backend::batch::{self, Inputs};
use r2vpo_llm::backend::candle::{CandleBackend, Transformer};
use r2vpo_llm::backend::{Backend, Policy};
use r2vpo_llm::experience::Sample;
use r2vpo_llm::model::{Architecture, ModelConfig};
use r2vpo_llm::train::TrainConfig;

mod common;

use common::packing::{flat, masked, micro_batches, optim, rel, samples, two_steps_agree};

/// Qwen3's layout (grouped-query attention, q/k norms, untied head) and
/// SmolLM2's (Llama, tied embeddings).
fn configs() -> Vec<(&'static str, ModelConfig)> {
    vec![
        ("qwen3", ModelConfig::tiny(Architecture::Qwen3, 300, 64, 128, 2, 4, 2, false)),
        ("smollm2", ModelConfig::tiny(Architecture::Llama, 300, 64, 160, 2, 4, 4, true)),
    ]
}

fn backend(cfg: &ModelConfig) -> CandleBackend {
    let m = Transformer::new_random_with_std(cfg.clone(), 5, 0.1, DType::F32, &Device::Cpu).unwrap();
    CandleBackend::new(m, optim(), false).unwrap()
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
        // Each aggregation mode: two optimizer steps from the same weights;
        // AdamW moves each entry by at most ~lr (1e-3) a step: the weights
        // agree to 1 % of one step.
        two_steps_agree(name, cfg.vocab_size as u32, &|| Box::new(backend(&cfg)), (1e-5, 1e-4, 1e-5));
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
