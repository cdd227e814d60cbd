//! Packed micro-batches against padded rows, for any backend: the samples
//! both layouts are made from, and R²VPO steps over them under each
//! aggregation mode (`packing.rs` on candle, `torch_backend.rs` on libtorch).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use r2vpo::aggregate::{Aggregation, GlobalBatch};
use r2vpo::dual::DualConfig;
use r2vpo::learner::Learner;
use r2vpo::objective::{ObjectiveConfig, PolicyBatch};
use r2vpo_llm::backend::batch::{self, MicroBatch};
use r2vpo_llm::backend::{forward_backward, Backend, OptimConfig};
use r2vpo_llm::experience::Sample;

/// Every aggregation mode the trainer offers.
pub const AGGREGATIONS: [Aggregation; 4] = [
    Aggregation::TokenMean,
    Aggregation::SeqMeanTokenMean,
    Aggregation::SeqMeanTokenSum,
    Aggregation::SeqMeanTokenSumNorm,
];

pub fn flat(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// The values of `t` where `mask` is 1.
pub fn masked(t: &Tensor, mask: &Tensor) -> Vec<f32> {
    flat(t).into_iter().zip(flat(mask)).filter(|(_, m)| *m > 0.0).map(|(x, _)| x).collect()
}

/// max |a − b| over max(|b|, floor).
pub fn rel(a: &[f32], b: &[f32], floor: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(floor, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Six samples whose prompts and responses span 1 to 40 tokens, in two
/// micro-batches of three, each holding two samples of one prompt (packed
/// once, then shared): every row but the longest is padded.
pub fn samples(vocab: u32) -> Vec<Sample> {
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
            is_weight: None,
            version: 0,
        })
        .collect()
}

/// Adam's ε well above the gradients' rounding, so an entry whose gradient
/// is noise moves by a noise-sized step rather than ±lr in either layout.
pub fn optim() -> OptimConfig {
    OptimConfig { lr: 1e-3, eps: 1e-3, weight_decay: 0.1, ..OptimConfig::default() }
}

/// `parts` as padded rows or packed.
pub fn micro_batches(parts: &[Vec<&Sample>], packed: bool) -> Vec<MicroBatch> {
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
/// `agg`: the log-probs and the losses of each micro-batch (the gradients
/// stay accumulated in `be`).
pub fn step(be: &mut dyn Backend, mbs: &[MicroBatch], agg: Aggregation) -> (Vec<Vec<f32>>, Vec<f32>) {
    let objective = ObjectiveConfig { aggregation: agg, ..ObjectiveConfig::default() };
    let learner = Learner::new(objective, &DualConfig { lambda0: 0.5, ..DualConfig::default() }).unwrap();
    let masks: Vec<&Tensor> = mbs.iter().map(|m| &m.mask).collect();
    let global = GlobalBatch::from_masks(&masks).unwrap().with_horizon(48.0);
    let (mut logps, mut losses) = (Vec::new(), Vec::new());
    for mb in mbs {
        let (fwd, loss, ()) = forward_backward::<_, r2vpo_llm::model::ModelError>(be, mb, false, |logp, _| {
            let batch =
                PolicyBatch { logp, old_logp: &mb.old_logp, advantages: &mb.advantages, mask: &mb.mask, weights: None };
            Ok((learner.loss(&batch, &global).map_err(|e| candle_core::Error::Msg(e.to_string()))?.loss, ()))
        })
        .unwrap();
        logps.push(masked(&fwd.logp, &mb.mask));
        losses.push(loss.to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap());
    }
    (logps, losses)
}

pub fn weights(be: &dyn Backend) -> HashMap<String, Vec<f32>> {
    be.export(0).unwrap().tensors.iter().map(|(n, t)| (n.clone(), flat(t))).collect()
}

/// Two AdamW steps of padded rows on `a` and of packed ones on `b` (two
/// backends from the same weights) under every aggregation mode: log-probs
/// and losses within `bound` relative, gradients within `grad_bound`, and
/// the weights after the two steps within `weight_bound` absolute.
pub fn two_steps_agree(
    name: &str,
    vocab: u32,
    make: &dyn Fn() -> Box<dyn Backend>,
    (bound, grad_bound, weight_bound): (f32, f32, f32),
) {
    let s = samples(vocab);
    let parts: Vec<Vec<&Sample>> = s.chunks(3).map(|c| c.iter().collect()).collect();
    let (padded, packed) = (micro_batches(&parts, false), micro_batches(&parts, true));
    for agg in AGGREGATIONS {
        let (mut a, mut b) = (make(), make());
        for k in 0..2 {
            let (la, xa) = step(a.as_mut(), &padded, agg);
            let (lb, xb) = step(b.as_mut(), &packed, agg);
            for (p, q) in la.iter().zip(&lb) {
                assert!(rel(q, p, 1.0) < bound, "{name} {agg:?} step {k}: log-probs");
            }
            assert!(rel(&xb, &xa, 1e-3) < bound, "{name} {agg:?} step {k}: losses {xa:?} vs {xb:?}");
            let (ga, gb) = (a.gradients().unwrap(), b.gradients().unwrap());
            assert_eq!(ga.len(), gb.len());
            for (n, g) in &ga {
                let d = rel(&flat(&gb[n]), &flat(g), 1e-6);
                assert!(d < grad_bound, "{name} {agg:?} step {k}: gradient of {n} differs by {d:e} (relative)");
            }
            a.step(1.0).unwrap();
            b.step(1.0).unwrap();
        }
        let (wa, wb) = (weights(a.as_ref()), weights(b.as_ref()));
        for (n, w) in &wa {
            let d = w.iter().zip(&wb[n]).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(d < weight_bound, "{name} {agg:?}: weight {n} after two steps differs by {d:e}");
        }
    }
}
